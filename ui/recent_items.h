#pragma once
// Recent models and datasets, kept with QSettings ("recent/models", "recent/datasets"): newest
// first, no duplicates, at most kRecentLimit of each. A run that starts adds its model and its
// dataset; the wizard's model and dataset pages offer them in a "Recent" menu.

#include <QList>
#include <QString>
#include <QStringList>

#include "engine/train/train_config.h"

namespace tandem::ui {

inline constexpr int kRecentLimit = 10;

struct RecentDataset {
  QString dir;      // dataset_dir
  QString dataset;  // the names (comma-separated) or a file path
  bool operator==(const RecentDataset&) const = default;
  QString label() const;  // "identity — /path/to/data"
};

QStringList recentModels();
QList<RecentDataset> recentDatasets();
void rememberModel(const QString& model);
void rememberDataset(const RecentDataset& dataset);
// The model and the dataset of a run that starts.
void rememberTrainConfig(const train::TrainConfig& config);
void clearRecent();

}  // namespace tandem::ui
