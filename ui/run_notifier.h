#pragma once
// Telling the user a run has ended when they are looking elsewhere. runNotice() words it;
// a Notifier shows it. DesktopNotifier uses the system tray's balloon when there is a tray,
// else org.freedesktop.Notifications over D-Bus (built with Qt6DBus), else the window alert
// (the taskbar entry flashes). MainWindow takes any Notifier, so tests see what would be shown.

#include <QObject>
#include <QPointer>
#include <QString>
#include <optional>

#include "ui/train_finish.h"

class QSystemTrayIcon;
class QWidget;

namespace tandem::ui {

struct RunNotice {
  QString title;  // "Training completed"
  QString body;   // run, steps, loss, folder; or the error and what to do
  bool failed = false;
};

// Completed, stopped and failed runs give a notice; a cancelled one does not (the user just
// asked for it, and it ends at once).
std::optional<RunNotice> runNotice(const TrainFinish& finish, const QString& run_name);

class Notifier {
 public:
  virtual ~Notifier() = default;
  virtual void notify(const RunNotice& notice) = 0;
};

class DesktopNotifier : public QObject, public Notifier {
  Q_OBJECT

 public:
  enum class Channel { Tray, DBus, Alert };

  // `window` is alerted when no tray or notification service takes the notice.
  explicit DesktopNotifier(QWidget* window);
  ~DesktopNotifier() override;
  void notify(const RunNotice& notice) override;
  // Where the next notice goes, as this session's desktop offers it.
  Channel channel() const;

 private:
  void alert();

  QPointer<QWidget> window_;
  QSystemTrayIcon* tray_ = nullptr;
};

}  // namespace tandem::ui
