#pragma once
// `tandem-studio --screenshot-tour DIR`: drives the real window through every page with the
// built-in demo (the wizard's five pages and the placement editor, a short real fine-tune on the
// dashboard, the run in the history, both answers in the chat tab, the settings dialog, a second
// run compared with the first, the preferences, the dark palette) and
// saves a PNG of each to DIR. docs/screenshots/ is made with it; tests/ui runs it under Xvfb.
// Exits non-zero and says why when a step does not happen.

#include <QObject>
#include <QString>
#include <QTemporaryDir>
#include <functional>

class QWidget;

namespace tandem::ui {
class MainWindow;
}

namespace tandem::studio {

class ScreenshotTour : public QObject {
  Q_OBJECT

 public:
  // `steps`: optimizer steps of the demo fine-tune (the preset's run is longer).
  ScreenshotTour(ui::MainWindow& window, QString dir, int steps);

 public slots:
  void run();  // ends the application with 0 (all pages saved) or 1

 private:
  void shoot(const QString& name);  // the main window
  // 8-bit palette PNG, or 24-bit with `full_colour` (a dark palette's greys would collapse into
  // one entry of the 8-bit colour cube, and its frames with them).
  void shoot(QWidget& widget, const QString& name, bool full_colour = false);
  void waitFor(const std::function<bool()>& done, int timeout_ms, const QString& what);
  void settle(int ms);
  void shootPreferences();  // 15-run-compare, 16-preferences, 16b-dark-palette

  ui::MainWindow& window_;
  QString dir_;
  int steps_;
  QTemporaryDir work_;
};

}  // namespace tandem::studio
