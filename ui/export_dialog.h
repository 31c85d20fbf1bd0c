#pragma once
// "Export…" on the runs page: the choices of `tandem export` (docs/export.md) for one run's
// adapter: a llama.cpp LoRA GGUF, or the base with the LoRA merged in as a Hugging Face folder or
// a GGUF (f16 / q8_0 / q4_k_m) with an Ollama Modelfile. The export runs on its own thread with a
// progress bar (tensors done, MB/s) and can be stopped; a stopped or failed export leaves nothing
// behind (engine/infer/deploy_export.h).

#include <QDialog>
#include <QString>
#include <filesystem>
#include <thread>

#include "engine/model/merged_export.h"

class QCheckBox;
class QComboBox;
class QLabel;
class QLineEdit;
class QProgressBar;
class QPushButton;

namespace tandem::ui {

class ExportDialog : public QDialog {
  Q_OBJECT

 public:
  // What to export: the run's base model, its adapter dir and its chat template.
  ExportDialog(const QString& base_model, const QString& adapter_dir, const QString& template_name,
               QWidget* parent = nullptr);
  ~ExportDialog() override;  // stops an export in progress and waits for its thread

  // The choices as the engine takes them ("lora", "hf", "gguf" in the format box).
  void setFormat(const QString& format);  // "lora" | "hf" | "gguf"
  void setQuant(const QString& quant);    // "f16" | "q8_0" | "q4_k_m"
  void setOutput(const QString& path);
  QString output() const;
  bool running() const { return worker_.joinable(); }
  // The folder or file the last finished export wrote; empty before one finished.
  const std::filesystem::path& written() const { return written_; }
  int progressPermille() const;

 public slots:
  void startExport();
  void stopExport();

 signals:
  void exportFinished(bool ok, const QString& message);

 private:
  void updateChoices();
  void showProgress(const model::ExportProgress& progress);
  void finishExport(const QString& error, const std::filesystem::path& written,
                    const QString& summary);
  QString defaultOutput() const;

  QString base_model_, adapter_dir_, template_name_;
  QComboBox* format_;
  QComboBox* quant_;
  QLineEdit* out_;
  QCheckBox* drop_lora_experts_;
  QProgressBar* bar_;
  QLabel* status_;
  QPushButton* export_;
  QPushButton* stop_;
  bool out_edited_ = false;
  std::filesystem::path written_;
  std::jthread worker_;
};

}  // namespace tandem::ui
