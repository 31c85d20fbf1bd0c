// The model page's Download… dialog against tests/cli/fake_hub.py (a local server that answers as
// the Hugging Face Hub does): look up a repo, see the size, download one GGUF of it with progress,
// and a transfer cut for good keeps its .incomplete file, from which the next try resumes.

#include <QLabel>
#include <QLineEdit>
#include <QProcess>
#include <QProgressBar>
#include <QPushButton>
#include <QTemporaryDir>
#include <QTest>
#include <filesystem>

#include "ui/download_dialog.h"

namespace tandem::ui {
namespace {

constexpr char kCommit[] = "0123456789abcdef0123456789abcdef01234567";

// Starts fake_hub.py with `args`; HF_ENDPOINT points at it until the next start.
bool startHub(QProcess& hub, const QStringList& args) {
  hub.start(QStringLiteral("python3"), QStringList{QStringLiteral(TANDEM_FAKE_HUB)} + args);
  if (!hub.waitForStarted(10000)) return false;
  while (!hub.canReadLine()) {
    if (!hub.waitForReadyRead(30000)) {
      qWarning("fake_hub.py did not start: %s", hub.readAllStandardError().constData());
      return false;
    }
  }
  const QStringList ports = QString::fromUtf8(hub.readLine()).trimmed().split(QLatin1Char(' '));
  if (ports.size() != 2) return false;
  qputenv("HF_ENDPOINT", "http://127.0.0.1:" + ports[0].toUtf8());
  return true;
}

void stopHub(QProcess& hub) {
  hub.closeWriteChannel();
  hub.waitForFinished(10000);
}

template <typename T>
T* child(QWidget& parent, const char* name) {
  return parent.findChild<T*>(QString::fromLatin1(name));
}

}  // namespace

class DownloadTest : public QObject {
  Q_OBJECT

 private slots:
  void looksUpDownloadsAndResumes();
};

void DownloadTest::looksUpDownloadsAndResumes() {
  QTemporaryDir home;
  qputenv("HF_HOME", home.path().toUtf8());
  qunsetenv("HF_TOKEN");
  const std::filesystem::path gguf = std::filesystem::path(home.path().toStdString()) / "hub" /
                                     "models--acme--tiny-moe" / "snapshots" / kCommit / "gguf" /
                                     "model-Q4_K_M.gguf";
  {
    // Every request of the GGUF stops after 400,000 bytes: the dialog fails, keeping them.
    QProcess hub;
    QVERIFY(startHub(
        hub, {QStringLiteral("--cut"), QStringLiteral("gguf/model-Q4_K_M.gguf:400000:100")}));
    DownloadDialog dialog;
    dialog.show();
    child<QLineEdit>(dialog, "repo_id")->setText(QStringLiteral("acme/tiny-moe"));
    child<QLineEdit>(dialog, "include")->setText(QStringLiteral("*.gguf"));
    QTest::mouseClick(child<QPushButton>(dialog, "look_up"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(child<QPushButton>(dialog, "download")->isEnabled(), 20000);
    QVERIFY2(
        child<QLabel>(dialog, "listing")->text().startsWith(QStringLiteral("1 file(s), 1.00 MiB")),
        qPrintable(child<QLabel>(dialog, "listing")->text()));
    QTest::mouseClick(child<QPushButton>(dialog, "download"), Qt::LeftButton);
    QTRY_VERIFY_WITH_TIMEOUT(
        child<QLabel>(dialog, "status")->text().contains(QStringLiteral("resumes there")), 60000);
    QCOMPARE(dialog.result(), int(QDialog::Rejected));
    QCOMPARE(std::filesystem::file_size(gguf.string() + ".incomplete"), uintmax_t{400000});
    stopHub(hub);
  }
  // The server whole again: the next try resumes and the dialog hands the GGUF file back.
  QProcess hub;
  QVERIFY(startHub(hub, {}));
  DownloadDialog dialog;
  dialog.show();
  child<QLineEdit>(dialog, "repo_id")->setText(QStringLiteral("acme/tiny-moe"));
  child<QLineEdit>(dialog, "include")->setText(QStringLiteral("*.gguf"));
  QTest::mouseClick(child<QPushButton>(dialog, "look_up"), Qt::LeftButton);
  QTRY_VERIFY_WITH_TIMEOUT(child<QPushButton>(dialog, "download")->isEnabled(), 20000);
  QTest::mouseClick(child<QPushButton>(dialog, "download"), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(dialog.result(), int(QDialog::Accepted), 60000);
  QCOMPARE(dialog.model(), gguf);
  QCOMPARE(std::filesystem::file_size(gguf), uintmax_t{1} << 20);
  QCOMPARE(child<QProgressBar>(dialog, "progress")->value(),
           child<QProgressBar>(dialog, "progress")->maximum());
  stopHub(hub);
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::DownloadTest)
#include "studio_download_test.moc"
