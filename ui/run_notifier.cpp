#include "ui/run_notifier.h"

#include <QApplication>
#include <QSystemTrayIcon>
#include <QTimer>
#include <QWidget>
#ifdef TANDEM_UI_WITH_DBUS
#include <QDBusConnection>
#include <QDBusConnectionInterface>
#include <QDBusMessage>
#include <QDBusPendingCallWatcher>
#include <QDBusPendingReply>
#endif

namespace tandem::ui {

namespace {

constexpr int kShownMs = 10000;  // how long a tray balloon stays up

#ifdef TANDEM_UI_WITH_DBUS
const QString kNotifyService = QStringLiteral("org.freedesktop.Notifications");

// The service may be D-Bus activatable rather than running: ask the bus for both.
bool notificationServiceAvailable() {
  const QDBusConnection bus = QDBusConnection::sessionBus();
  if (!bus.isConnected() || !bus.interface()) return false;
  if (bus.interface()->isServiceRegistered(kNotifyService)) return true;
  const QDBusReply<QStringList> activatable =
      bus.interface()->call(QStringLiteral("ListActivatableNames"));
  return activatable.isValid() && activatable.value().contains(kNotifyService);
}
#endif

}  // namespace

std::optional<RunNotice> runNotice(const TrainFinish& f, const QString& run_name) {
  const QString where =
      f.output_dir.isEmpty() ? QString() : QObject::tr("\nOutput: %1").arg(f.output_dir);
  switch (f.end) {
    case TrainEnd::Completed:
      return RunNotice{QObject::tr("Training completed"),
                       QObject::tr("%1: %2 steps, final loss %3")
                               .arg(run_name)
                               .arg(f.steps)
                               .arg(f.final_loss, 0, 'f', 4) +
                           where,
                       false};
    case TrainEnd::Stopped:
      return RunNotice{QObject::tr("Training stopped"),
                       QObject::tr("%1: stopped at step %2 with a checkpoint; it can be resumed")
                               .arg(run_name)
                               .arg(f.steps) +
                           where,
                       false};
    case TrainEnd::Failed:
      return RunNotice{
          QObject::tr("Training failed"),
          QObject::tr("%1: %2").arg(run_name, f.error) +
              (f.what_to_do.isEmpty() ? QString() : QStringLiteral("\n") + f.what_to_do),
          true};
    case TrainEnd::Cancelled: return std::nullopt;
  }
  return std::nullopt;
}

DesktopNotifier::DesktopNotifier(QWidget* window) : QObject(window), window_(window) {}

DesktopNotifier::~DesktopNotifier() = default;

DesktopNotifier::Channel DesktopNotifier::channel() const {
  if (QSystemTrayIcon::isSystemTrayAvailable()) return Channel::Tray;
#ifdef TANDEM_UI_WITH_DBUS
  if (notificationServiceAvailable()) return Channel::DBus;
#endif
  return Channel::Alert;
}

void DesktopNotifier::alert() {
  if (window_) QApplication::alert(window_);  // no-op while the window is active
}

void DesktopNotifier::notify(const RunNotice& notice) {
  switch (channel()) {
    case Channel::Tray:
      if (!tray_) {
        tray_ = new QSystemTrayIcon(QIcon(QStringLiteral(":/icons/tandem.svg")), this);
        tray_->setToolTip(QApplication::applicationName());
        connect(tray_, &QSystemTrayIcon::messageClicked, this, [this] {
          if (!window_) return;
          window_->showNormal();
          window_->raise();
          window_->activateWindow();
        });
      }
      tray_->show();  // a balloon needs a visible icon; it goes again with the balloon
      tray_->showMessage(notice.title, notice.body,
                         notice.failed ? QSystemTrayIcon::Critical : QSystemTrayIcon::Information,
                         kShownMs);
      QTimer::singleShot(kShownMs + 2000, tray_, &QSystemTrayIcon::hide);
      break;
    case Channel::DBus: {
#ifdef TANDEM_UI_WITH_DBUS
      // org.freedesktop.Notifications.Notify(app_name, replaces_id, app_icon, summary, body,
      // actions, hints, expire_timeout); asynchronous, so a slow service never holds the GUI.
      QDBusMessage call = QDBusMessage::createMethodCall(
          kNotifyService, QStringLiteral("/org/freedesktop/Notifications"), kNotifyService,
          QStringLiteral("Notify"));
      QVariantMap hints;
      hints.insert(QStringLiteral("urgency"), QVariant::fromValue<uchar>(notice.failed ? 2 : 1));
      hints.insert(QStringLiteral("desktop-entry"), QStringLiteral("io.github.tandem.Studio"));
      call << QApplication::applicationName() << 0u << QStringLiteral("io.github.tandem.Studio")
           << notice.title << notice.body << QStringList() << hints << -1;
      auto* watcher =
          new QDBusPendingCallWatcher(QDBusConnection::sessionBus().asyncCall(call), this);
      connect(watcher, &QDBusPendingCallWatcher::finished, this,
              [this](QDBusPendingCallWatcher* w) {
                if (w->isError()) alert();
                w->deleteLater();
              });
#endif
      break;
    }
    case Channel::Alert: break;
  }
  alert();
}

}  // namespace tandem::ui
