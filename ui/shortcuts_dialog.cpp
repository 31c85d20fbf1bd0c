#include "ui/shortcuts_dialog.h"

#include <QAbstractButton>
#include <QAction>
#include <QDialogButtonBox>
#include <QHeaderView>
#include <QLabel>
#include <QMenu>
#include <QMenuBar>
#include <QTabWidget>
#include <QTableWidget>
#include <QVBoxLayout>

namespace tandem::ui {

namespace {

QString plain(QString text) {
  text.replace(QStringLiteral("&&"), QStringLiteral("\x01"));
  text.remove(QLatin1Char('&'));
  text.replace(QStringLiteral("\x01"), QStringLiteral("&"));
  return text;
}

QString keysText(const QList<QKeySequence>& keys) {
  QStringList texts;
  for (const QKeySequence& k : keys) texts << k.toString(QKeySequence::NativeText);
  return texts.join(QStringLiteral(", "));
}

void addMenu(const QMenu& menu, const QString& where, QList<ShortcutRow>& out) {
  for (QAction* action : menu.actions()) {
    if (action->isSeparator()) continue;
    if (action->menu()) {
      addMenu(*action->menu(), where + QStringLiteral(" > ") + plain(action->text()), out);
      continue;
    }
    out.append({where, plain(action->text()), keysText(action->shortcuts())});
  }
}

}  // namespace

QList<ShortcutRow> menuShortcuts(const QMenuBar& menu_bar) {
  QList<ShortcutRow> out;
  for (QAction* top : menu_bar.actions()) {
    if (top->menu()) addMenu(*top->menu(), QObject::tr("%1 menu").arg(plain(top->text())), out);
  }
  return out;
}

QList<ShortcutRow> pageShortcuts(const QTabWidget& tabs) {
  QList<ShortcutRow> out;
  for (int i = 0; i < tabs.count(); ++i) {
    const QString where = QObject::tr("%1 page").arg(plain(tabs.tabText(i)));
    for (const QAbstractButton* b : tabs.widget(i)->findChildren<QAbstractButton*>()) {
      if (b->shortcut().isEmpty() || b->text().isEmpty()) continue;
      out.append({where, plain(b->text()), b->shortcut().toString(QKeySequence::NativeText)});
    }
  }
  return out;
}

ShortcutsDialog::ShortcutsDialog(const QMenuBar& menu_bar, const QTabWidget* tabs, QWidget* parent)
    : QDialog(parent) {
  setWindowTitle(tr("Keyboard shortcuts"));
  rows_ = menuShortcuts(menu_bar);
  if (tabs) rows_ += pageShortcuts(*tabs);
  table_ = new QTableWidget(static_cast<int>(rows_.size()), 3);
  table_->setHorizontalHeaderLabels({tr("Where"), tr("Action"), tr("Keys")});
  table_->verticalHeader()->setVisible(false);
  table_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  table_->setSelectionBehavior(QAbstractItemView::SelectRows);
  table_->setAccessibleName(tr("Keyboard shortcuts"));
  for (int row = 0; row < static_cast<int>(rows_.size()); ++row) {
    table_->setItem(row, 0, new QTableWidgetItem(rows_[row].where));
    table_->setItem(row, 1, new QTableWidgetItem(rows_[row].action));
    table_->setItem(row, 2, new QTableWidgetItem(rows_[row].shortcut));
  }
  table_->resizeColumnsToContents();
  table_->horizontalHeader()->setStretchLastSection(true);
  auto* note = new QLabel(
      tr("Page keys work while the page is shown; Alt+letter keys are the underlined letters."));
  note->setWordWrap(true);
  auto* buttons = new QDialogButtonBox(QDialogButtonBox::Close);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  auto* layout = new QVBoxLayout(this);
  layout->addWidget(table_, 1);
  layout->addWidget(note);
  layout->addWidget(buttons);
  resize(620, 560);
}

int ShortcutsDialog::rowCount() const { return table_->rowCount(); }

}  // namespace tandem::ui
