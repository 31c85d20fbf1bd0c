#include "ui/download_dialog.h"

#include <QDialogButtonBox>
#include <QFormLayout>
#include <QLabel>
#include <QLineEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QRegularExpression>
#include <QVBoxLayout>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "ui/error_text.h"

namespace tandem::ui {
namespace {

// The one GGUF model file among `files` (a sharded one by its first shard), if there is one.
std::optional<std::string> singleGguf(const std::vector<hub::HubFile>& files) {
  std::vector<std::string> ggufs;
  for (const hub::HubFile& f : files) {
    const bool gguf = f.path.size() > 5 && f.path.substr(f.path.size() - 5) == ".gguf";
    const bool later_shard =
        f.path.find("-of-") != std::string::npos && f.path.find("-00001-of-") == std::string::npos;
    if (gguf && !later_shard) ggufs.push_back(f.path);
  }
  if (ggufs.size() != 1) return std::nullopt;
  return ggufs.front();
}

}  // namespace

DownloadDialog::DownloadDialog(QWidget* parent) : QDialog(parent) {
  setWindowTitle(tr("Download from Hugging Face"));
  repo_id_ = new QLineEdit;
  repo_id_->setObjectName(QStringLiteral("repo_id"));
  repo_id_->setPlaceholderText(tr("Qwen/Qwen3-30B-A3B"));
  include_ = new QLineEdit;
  include_->setObjectName(QStringLiteral("include"));
  include_->setPlaceholderText(tr("every file; or e.g. *Q4_K_M*.gguf"));
  include_->setToolTip(tr("Globs separated by spaces: only the files matching one are fetched"));
  listing_ = new QLabel;
  listing_->setObjectName(QStringLiteral("listing"));
  listing_->setWordWrap(true);
  listing_->setTextFormat(Qt::PlainText);
  bar_ = new QProgressBar;
  bar_->setObjectName(QStringLiteral("progress"));
  bar_->setRange(0, 1000);
  bar_->setValue(0);
  status_ = new QLabel;
  status_->setObjectName(QStringLiteral("status"));
  status_->setWordWrap(true);
  status_->setTextFormat(Qt::PlainText);
  look_up_ = new QPushButton(tr("&Look up"));
  look_up_->setObjectName(QStringLiteral("look_up"));
  download_ = new QPushButton(tr("&Download"));
  download_->setObjectName(QStringLiteral("download"));
  download_->setEnabled(false);
  stop_ = new QPushButton(tr("&Stop"));
  stop_->setObjectName(QStringLiteral("stop"));
  stop_->setEnabled(false);

  auto* form = new QFormLayout;
  form->addRow(tr("&Repository:"), repo_id_);
  form->addRow(tr("&Only files matching:"), include_);
  auto* buttons = new QDialogButtonBox;
  buttons->addButton(look_up_, QDialogButtonBox::ActionRole);
  buttons->addButton(download_, QDialogButtonBox::ActionRole);
  buttons->addButton(stop_, QDialogButtonBox::ActionRole);
  buttons->addButton(QDialogButtonBox::Close);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(form);
  layout->addWidget(listing_);
  layout->addWidget(bar_);
  layout->addWidget(status_);
  layout->addWidget(buttons);

  connect(look_up_, &QPushButton::clicked, this, &DownloadDialog::lookUp);
  connect(repo_id_, &QLineEdit::returnPressed, this, &DownloadDialog::lookUp);
  connect(include_, &QLineEdit::returnPressed, this, &DownloadDialog::lookUp);
  connect(download_, &QPushButton::clicked, this, &DownloadDialog::startDownload);
  connect(stop_, &QPushButton::clicked, this, &DownloadDialog::stopDownload);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
}

DownloadDialog::~DownloadDialog() {
  if (stop_requested_) *stop_requested_ = true;
  if (transfer_.joinable()) transfer_.join();
}

std::vector<std::string> DownloadDialog::includePatterns() const {
  std::vector<std::string> patterns;
  for (const QString& p :
       include_->text().split(QRegularExpression(QStringLiteral("[\\s,]+")), Qt::SkipEmptyParts))
    patterns.push_back(p.toStdString());
  return patterns;
}

void DownloadDialog::lookUp() {
  repo_.reset();
  download_->setEnabled(false);
  listing_->setText(tr("Looking up %1…").arg(repo_id_->text().trimmed()));
  status_->clear();
  lookup_.request(
      [id = repo_id_->text().trimmed().toStdString()] {
        return hub::fetchHubRepo(hub::hubSettingsFromEnvironment(), id, "main");
      },
      [this](EngineResult<hub::HubRepo> repo) { showRepo(std::move(repo)); });
}

void DownloadDialog::showRepo(EngineResult<hub::HubRepo> repo) {
  if (!repo.ok()) {
    listing_->setText(repo.error);
    return;
  }
  files_ = hub::selectFiles(repo.value->files, includePatterns());
  uint64_t total = 0;
  for (const hub::HubFile& f : files_) total += f.size;
  repo_ = std::move(*repo.value);
  if (files_.empty()) {
    listing_->setText(tr("No file of %1 matches those patterns (it has %2 files).")
                          .arg(QString::fromStdString(repo_->id))
                          .arg(repo_->files.size()));
    return;
  }
  listing_->setText(
      tr("%1 file(s), %2, into %3")
          .arg(files_.size())
          .arg(QString::fromStdString(formatBytes(total)))
          .arg(QString::fromStdString(
              hub::downloadDir(hub::hubSettingsFromEnvironment(), *repo_, {}).string())));
  download_->setEnabled(true);
}

void DownloadDialog::startDownload() {
  if (!repo_ || transfer_.joinable()) return;
  download_->setEnabled(false);
  look_up_->setEnabled(false);
  stop_->setEnabled(true);
  status_->setText(tr("Starting…"));
  stop_requested_ = std::make_shared<std::atomic<bool>>(false);
  transfer_ = std::thread([this, repo = *repo_, files = files_, stop = stop_requested_] {
    hub::DownloadOptions options;
    options.cancelled = [stop] { return stop->load(); };
    options.progress = [this](const hub::DownloadProgress& p) {
      QMetaObject::invokeMethod(
          this, [this, p] { showProgress(p); }, Qt::QueuedConnection);
    };
    QString error;
    std::filesystem::path dir;
    try {
      dir = hub::downloadFiles(hub::hubSettingsFromEnvironment(), repo, files, options).dir;
    } catch (const Error& e) {
      error = errorText(e);
    } catch (const std::exception& e) {
      error = QString::fromUtf8(e.what());
    }
    QMetaObject::invokeMethod(
        this, [this, error, dir] { finishDownload(error, dir); }, Qt::QueuedConnection);
  });
}

void DownloadDialog::stopDownload() {
  if (stop_requested_) *stop_requested_ = true;
  stop_->setEnabled(false);
  status_->setText(tr("Stopping… what arrived is kept; Download continues from there."));
}

void DownloadDialog::showProgress(const hub::DownloadProgress& p) {
  if (p.total > 0)
    bar_->setValue(
        static_cast<int>(1000.0 * static_cast<double>(p.done) / static_cast<double>(p.total)));
  const double left = static_cast<double>(p.total - std::min(p.done, p.total));
  const QString eta = p.bytes_per_second > 0
                          ? QString::fromStdString(formatDuration(left / p.bytes_per_second))
                          : QStringLiteral("?");
  status_->setText(
      tr("[%1/%2] %3 — %4 of %5, %6/s, ETA %7")
          .arg(p.file_index)
          .arg(p.file_count)
          .arg(QString::fromStdString(p.file))
          .arg(QString::fromStdString(formatBytes(p.done)))
          .arg(QString::fromStdString(formatBytes(p.total)))
          .arg(QString::fromStdString(formatBytes(static_cast<uint64_t>(p.bytes_per_second))))
          .arg(eta));
}

void DownloadDialog::finishDownload(const QString& error, const std::filesystem::path& dir) {
  if (transfer_.joinable()) transfer_.join();
  stop_->setEnabled(false);
  look_up_->setEnabled(true);
  download_->setEnabled(true);
  if (!error.isEmpty()) {
    status_->setText(error);
    return;
  }
  bar_->setValue(bar_->maximum());
  const std::optional<std::string> gguf = singleGguf(files_);
  model_ = gguf ? dir / *gguf : dir;
  accept();
}

}  // namespace tandem::ui
