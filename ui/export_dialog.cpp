#include "ui/export_dialog.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDialogButtonBox>
#include <QFormLayout>
#include <QLabel>
#include <QLineEdit>
#include <QProgressBar>
#include <QPushButton>
#include <QVBoxLayout>

#include "engine/core/error.h"
#include "engine/core/units.h"
#include "engine/infer/deploy_export.h"
#include "engine/io/gguf_model.h"
#include "engine/model/adapter_files.h"
#include "ui/error_text.h"
#include "ui/path_field.h"

namespace tandem::ui {
namespace fs = std::filesystem;

namespace {

QString str(const fs::path& p) { return QString::fromStdString(p.string()); }
fs::path path(const QString& s) { return fs::path(s.toStdString()); }

}  // namespace

ExportDialog::ExportDialog(const QString& base_model, const QString& adapter_dir,
                           const QString& template_name, QWidget* parent)
    : QDialog(parent),
      base_model_(base_model),
      adapter_dir_(adapter_dir),
      template_name_(template_name) {
  setWindowTitle(tr("Export adapter"));
  setObjectName(QStringLiteral("export_dialog"));
  format_ = new QComboBox;
  format_->setObjectName(QStringLiteral("format"));
  format_->addItem(tr("Merged model, GGUF (llama.cpp, Ollama)"), QStringLiteral("gguf"));
  format_->addItem(tr("Merged model, Hugging Face folder (transformers, vLLM, SGLang)"),
                   QStringLiteral("hf"));
  format_->addItem(tr("LoRA adapter only, GGUF (llama.cpp --lora, Ollama ADAPTER)"),
                   QStringLiteral("lora"));
  quant_ = new QComboBox;
  quant_->setObjectName(QStringLiteral("quant"));
  quant_->addItem(tr("f16 (no loss)"), QStringLiteral("f16"));
  quant_->addItem(tr("q8_0 (half the size)"), QStringLiteral("q8_0"));
  quant_->addItem(tr("q4_k_m (a quarter, llama.cpp's mix)"), QStringLiteral("q4_k_m"));
  out_ = new QLineEdit;
  out_->setObjectName(QStringLiteral("out"));
  drop_lora_experts_ =
      new QCheckBox(tr("Leave out the LoRA experts (the export is then a "
                       "different model)"));
  drop_lora_experts_->setObjectName(QStringLiteral("drop_lora_experts"));
  drop_lora_experts_->setVisible(model::adapterHasLoraExperts(path(adapter_dir_)));
  bar_ = new QProgressBar;
  bar_->setObjectName(QStringLiteral("progress"));
  bar_->setRange(0, 1000);
  bar_->setValue(0);
  status_ = new QLabel;
  status_->setObjectName(QStringLiteral("status"));
  status_->setWordWrap(true);
  status_->setTextFormat(Qt::PlainText);
  export_ = new QPushButton(tr("&Export"));
  export_->setObjectName(QStringLiteral("export"));
  export_->setDefault(true);
  stop_ = new QPushButton(tr("&Stop"));
  stop_->setObjectName(QStringLiteral("stop"));
  stop_->setEnabled(false);

  auto* form = new QFormLayout;
  auto* adapter = new QLabel(adapter_dir_);
  adapter->setTextInteractionFlags(Qt::TextSelectableByMouse);
  auto* base = new QLabel(base_model_);
  base->setTextInteractionFlags(Qt::TextSelectableByMouse);
  form->addRow(tr("Adapter:"), adapter);
  form->addRow(tr("Base model:"), base);
  form->addRow(tr("&Format:"), format_);
  form->addRow(tr("&Quantization:"), quant_);
  form->addRow(tr("&Write to:"), pathField(out_, PathKind::Folder, tr("Export to")));
  form->addRow(QString(), drop_lora_experts_);
  auto* buttons = new QDialogButtonBox;
  buttons->addButton(export_, QDialogButtonBox::ActionRole);
  buttons->addButton(stop_, QDialogButtonBox::ActionRole);
  buttons->addButton(QDialogButtonBox::Close);
  auto* layout = new QVBoxLayout(this);
  layout->addLayout(form);
  layout->addWidget(bar_);
  layout->addWidget(status_);
  layout->addWidget(buttons);

  // A GGUF export needs a GGUF base (an HF one is converted with llama.cpp first): start with
  // what works for this run's base.
  if (!io::isGgufPath(path(base_model_))) setFormat(QStringLiteral("hf"));
  connect(format_, &QComboBox::currentIndexChanged, this, &ExportDialog::updateChoices);
  connect(quant_, &QComboBox::currentIndexChanged, this, &ExportDialog::updateChoices);
  connect(out_, &QLineEdit::textEdited, this, [this] { out_edited_ = true; });
  connect(export_, &QPushButton::clicked, this, &ExportDialog::startExport);
  connect(stop_, &QPushButton::clicked, this, &ExportDialog::stopExport);
  connect(buttons, &QDialogButtonBox::rejected, this, &QDialog::reject);
  updateChoices();
}

ExportDialog::~ExportDialog() {
  worker_.request_stop();
  if (worker_.joinable()) worker_.join();
}

void ExportDialog::setFormat(const QString& format) {
  format_->setCurrentIndex(format_->findData(format));
}
void ExportDialog::setQuant(const QString& quant) {
  quant_->setCurrentIndex(quant_->findData(quant));
}
void ExportDialog::setOutput(const QString& path) {
  out_->setText(path);
  out_edited_ = true;
}
QString ExportDialog::output() const { return out_->text(); }
int ExportDialog::progressPermille() const { return bar_->value(); }

QString ExportDialog::defaultOutput() const {
  const QString format = format_->currentData().toString();
  if (format == QLatin1String("lora")) return str(path(adapter_dir_) / "adapter_model.gguf");
  model::MergedExportRequest request;
  request.adapter = path(adapter_dir_);
  request.format = model::parseExportFormat(format.toStdString());
  request.quant = model::parseGgufQuant(quant_->currentData().toString().toStdString());
  return str(infer::defaultExportDir(request));
}

void ExportDialog::updateChoices() {
  quant_->setEnabled(format_->currentData().toString() == QLatin1String("gguf"));
  if (!out_edited_) out_->setText(defaultOutput());
}

void ExportDialog::startExport() {
  if (worker_.joinable()) return;
  const QString format = format_->currentData().toString();
  const fs::path out = path(out_->text().trimmed());
  model::MergedExportRequest request;
  request.adapter = path(adapter_dir_);
  request.base = path(base_model_);
  request.out_dir = out;
  request.drop_lora_experts = drop_lora_experts_->isChecked();
  const bool merge = format != QLatin1String("lora");
  if (merge) {
    request.format = model::parseExportFormat(format.toStdString());
    request.quant = model::parseGgufQuant(quant_->currentData().toString().toStdString());
  }
  export_->setEnabled(false);
  stop_->setEnabled(merge);
  bar_->setValue(0);
  status_->setText(tr("Starting…"));
  written_.clear();
  const std::string template_name = template_name_.toStdString();
  worker_ = std::jthread([this, request, merge, template_name](std::stop_token stop) {
    QString error, summary;
    fs::path written;
    try {
      if (request.drop_lora_experts == false && model::adapterHasLoraExperts(request.adapter)) {
        throw Error(request.adapter.string() + " has LoRA experts, which an export cannot hold",
                    "tick \"Leave out the LoRA experts\", or use the adapter with Tandem");
      }
      if (merge) {
        const infer::DeployExportResult result = infer::exportMerged(
            request, template_name,
            [this](const model::ExportProgress& p) {
              QMetaObject::invokeMethod(
                  this, [this, p] { showProgress(p); }, Qt::QueuedConnection);
            },
            stop);
        written = result.out_dir;
        summary = tr("Merged %1 LoRA modules; wrote %2 (%3).")
                      .arg(result.merge.merged_modules)
                      .arg(str(result.out_dir))
                      .arg(QString::fromStdString(formatBytes(result.merge.bytes)));
        if (!result.modelfile.empty())
          summary += tr(" Ollama: ollama create NAME -f %1").arg(str(result.modelfile));
      } else {
        model::exportLlamaCppAdapter(request.adapter, request.base, request.out_dir);
        infer::writeOllamaModelfile(
            request.out_dir.parent_path() / "Modelfile", fs::absolute(request.base).string(),
            "./" + request.out_dir.filename().string(), request.base, template_name);
        written = request.out_dir;
        summary = tr("Wrote %1 and a Modelfile beside it (llama-cli -m BASE --lora FILE).")
                      .arg(str(request.out_dir));
      }
    } catch (const Error& e) {
      error = errorText(e);
    } catch (const std::exception& e) {
      error = QString::fromUtf8(e.what());
    }
    QMetaObject::invokeMethod(
        this, [this, error, written, summary] { finishExport(error, written, summary); },
        Qt::QueuedConnection);
  });
}

void ExportDialog::stopExport() {
  worker_.request_stop();
  stop_->setEnabled(false);
  status_->setText(tr("Stopping… nothing is left behind."));
}

void ExportDialog::showProgress(const model::ExportProgress& p) {
  bar_->setValue(static_cast<int>(1000.0 * p.fraction()));
  const double mb = static_cast<double>(p.bytes_written) / 1e6;
  status_->setText(tr("[%1/%2 tensors] %3 MB, %4 MB/s — %5")
                       .arg(p.tensors_done)
                       .arg(p.tensors_total)
                       .arg(mb, 0, 'f', 0)
                       .arg(p.elapsed_s > 0 ? mb / p.elapsed_s : 0.0, 0, 'f', 1)
                       .arg(QString::fromStdString(p.tensor)));
}

void ExportDialog::finishExport(const QString& error, const fs::path& written,
                                const QString& summary) {
  if (worker_.joinable()) worker_.join();
  worker_ = std::jthread();
  export_->setEnabled(true);
  stop_->setEnabled(false);
  if (!error.isEmpty()) {
    status_->setText(error);
    emit exportFinished(false, error);
    return;
  }
  bar_->setValue(bar_->maximum());
  written_ = written;
  status_->setText(summary);
  emit exportFinished(true, summary);
}

}  // namespace tandem::ui
