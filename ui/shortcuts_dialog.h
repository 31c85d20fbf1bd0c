#pragma once
// Help > Keyboard shortcuts: every menu action with its shortcut, and the buttons of each page
// with theirs (Alt+letter mnemonics included), read from the live widgets, so the list cannot
// drift from what the keys do.

#include <QDialog>
#include <QList>
#include <QString>

class QMenuBar;
class QTabWidget;
class QTableWidget;

namespace tandem::ui {

struct ShortcutRow {
  QString where;     // "File menu", "Runs page"
  QString action;    // the text without its '&'
  QString shortcut;  // native text, several joined by ", "; empty when there is none
};

// The menu bar's actions (submenus included, separators and submenu entries left out).
QList<ShortcutRow> menuShortcuts(const QMenuBar& menu_bar);
// The buttons with a shortcut on each page of `tabs`.
QList<ShortcutRow> pageShortcuts(const QTabWidget& tabs);

class ShortcutsDialog : public QDialog {
  Q_OBJECT

 public:
  ShortcutsDialog(const QMenuBar& menu_bar, const QTabWidget* tabs, QWidget* parent = nullptr);
  int rowCount() const;
  QList<ShortcutRow> rows() const { return rows_; }

 private:
  QList<ShortcutRow> rows_;
  QTableWidget* table_;
};

}  // namespace tandem::ui
