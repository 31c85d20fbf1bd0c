#include "ui/dataset_preview.h"

#include <QObject>
#include <algorithm>
#include <span>

#include "engine/chat/chat_template.h"
#include "engine/chat/tokenizer_encoder.h"
#include "engine/core/error.h"
#include "engine/io/tokenizer.h"

namespace tandem::ui {

DatasetPreview loadDatasetPreview(const train::TrainConfig& config) {
  if (config.dataset.empty())
    throw Error("no dataset chosen", "pick a name from dataset_info.json or a file");
  DatasetPreview preview;
  std::vector<chat::Conversation> rows =
      train::loadDatasets(config.dataset_dir, config.dataset, config.max_samples, preview.report);
  rows.resize(std::min<size_t>(rows.size(), kPreviewRows));
  preview.first_rows = std::move(rows);
  return preview;
}

QString datasetReportText(const train::DatasetReport& report) {
  QString text =
      QObject::tr("%1 rows usable, %2 skipped.").arg(report.totalKept()).arg(report.totalSkipped());
  for (const train::DatasetFileReport& d : report.datasets) {
    for (const train::RowProblem& p : d.first_problems) {
      text += QObject::tr("\n  %1 line %2: %3")
                  .arg(QString::fromStdString(d.file))
                  .arg(p.line)
                  .arg(QString::fromStdString(p.reason));
    }
  }
  return text;
}

QString sampleHtml(const io::Tokenizer& tokenizer, const chat::Conversation& row,
                   const std::string& template_name, const chat::SupervisedOptions& options) {
  const chat::ChatTemplate& chat_template = chat::templateByName(template_name);
  const chat::TokenizerEncoder encoder(tokenizer, chat_template);
  const chat::EncodedSample sample = chat::encodeSupervised(row, chat_template, encoder, options);
  QString html = QStringLiteral("<div style='font-family:monospace; white-space:pre-wrap;'>");
  int64_t trained = 0;
  for (size_t i = 0; i < sample.input_ids.size(); ++i) {
    const bool is_trained = sample.labels[i] != chat::kIgnoreIndex;
    trained += is_trained ? 1 : 0;
    const int32_t id = sample.input_ids[i];
    const QString piece =
        QString::fromStdString(tokenizer.decode(std::span<const int32_t>(&id, 1)));
    const char* shade = (is_trained ? kTrainedShades : kMaskedShades)[i % 2];
    html += QStringLiteral("<span style='background:%1;%2'>%3</span>")
                .arg(shade, is_trained ? "" : "color:#444;",
                     piece.toHtmlEscaped().replace(QLatin1Char('\n'), QStringLiteral("↵<br>")));
  }
  html += QStringLiteral("</div><p>%1 tokens, %2 trained, %3 masked (cutoff %4)</p>")
              .arg(sample.input_ids.size())
              .arg(trained)
              .arg(static_cast<int64_t>(sample.input_ids.size()) - trained)
              .arg(options.cutoff_len);
  return html;
}

}  // namespace tandem::ui
