#pragma once
// The engine side of the dataset page, run on its workers: the data read as training reads it
// (the first rows kept for the table, the counts and first problems of all of them), and one
// row as the model sees it, rendered by the chat template and tokenised, each token shaded by
// whether it is trained on.

#include <QString>
#include <string>
#include <vector>

#include "engine/chat/conversation.h"
#include "engine/chat/supervised_encoder.h"
#include "engine/train/dataset.h"
#include "engine/train/train_config.h"

namespace tandem::io {
class Tokenizer;
}

namespace tandem::ui {

inline constexpr int kPreviewRows = 50;
// Two shades each, alternating token by token, so token boundaries show.
inline constexpr const char* kTrainedShades[2] = {"#c8f0d0", "#a6e3b5"};
inline constexpr const char* kMaskedShades[2] = {"#e4e4e4", "#cfcfcf"};

struct DatasetPreview {
  std::vector<chat::Conversation> first_rows;  // at most kPreviewRows
  train::DatasetReport report;                 // over every row
};

// The datasets `config` names (dataset_dir, dataset, max_samples), read by train::loadDatasets.
// Throws tandem::Error: no dataset chosen, and whatever loadDatasets throws.
DatasetPreview loadDatasetPreview(const train::TrainConfig& config);

// "N rows usable, M skipped." and the first problems with their files and lines.
QString datasetReportText(const train::DatasetReport& report);

// `row` encoded as training encodes it (chat::encodeSupervised), as HTML: one span per token,
// trained ones on green and masked ones (label -100) on grey, then the token counts. Throws
// tandem::Error (an unknown template, a template without an end token, a bad token id).
QString sampleHtml(const io::Tokenizer& tokenizer, const chat::Conversation& row,
                   const std::string& template_name, const chat::SupervisedOptions& options);

}  // namespace tandem::ui
