#pragma once
// "Download from Hugging Face…" on the model page: a repo id (and optional include globs), its
// files and size looked up first, then the transfer on its own thread with a progress bar, rate
// and ETA, stoppable, resumed by the next try (engine/hub, docs/download.md).

#include <QDialog>
#include <atomic>
#include <filesystem>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "engine/hub/hub_download.h"
#include "engine/hub/hub_repo.h"
#include "ui/engine_worker.h"

class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;

namespace tandem::ui {

class DownloadDialog : public QDialog {
  Q_OBJECT

 public:
  explicit DownloadDialog(QWidget* parent = nullptr);
  ~DownloadDialog() override;  // stops a transfer in progress and waits for its thread

  // After accept(): the model to use, the snapshot folder, or the one GGUF file when the files
  // fetched hold exactly one .gguf (or its first shard).
  const std::filesystem::path& model() const { return model_; }

 private:
  void lookUp();
  void showRepo(EngineResult<hub::HubRepo> repo);
  void startDownload();
  void stopDownload();
  void showProgress(const hub::DownloadProgress& progress);
  void finishDownload(const QString& error, const std::filesystem::path& dir);
  std::vector<std::string> includePatterns() const;

  QLineEdit* repo_id_;
  QLineEdit* include_;
  QLabel* listing_;
  QProgressBar* bar_;
  QLabel* status_;
  QPushButton* look_up_;
  QPushButton* download_;
  QPushButton* stop_;
  std::optional<hub::HubRepo> repo_;
  std::vector<hub::HubFile> files_;
  std::filesystem::path model_;
  std::shared_ptr<std::atomic<bool>> stop_requested_;
  std::thread transfer_;
  EngineWorker lookup_{this};
};

}  // namespace tandem::ui
