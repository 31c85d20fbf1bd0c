#include "ui/recent_items.h"

#include <QSettings>

namespace tandem::ui {

namespace {

const QString kModelsKey = QStringLiteral("recent/models");
const QString kDatasetsKey = QStringLiteral("recent/datasets");

// `item` first, its older copy gone, the oldest past the limit dropped.
template <typename T>
void pushFront(QList<T>& items, const T& item) {
  items.removeAll(item);
  items.prepend(item);
  while (items.size() > kRecentLimit) items.removeLast();
}

void storeDatasets(const QList<RecentDataset>& datasets) {
  QSettings s;
  s.remove(kDatasetsKey);
  s.beginWriteArray(kDatasetsKey, static_cast<int>(datasets.size()));
  for (int i = 0; i < datasets.size(); ++i) {
    s.setArrayIndex(i);
    s.setValue(QStringLiteral("dir"), datasets[i].dir);
    s.setValue(QStringLiteral("dataset"), datasets[i].dataset);
  }
  s.endArray();
}

}  // namespace

QString RecentDataset::label() const {
  return dir.isEmpty() ? dataset : QStringLiteral("%1 — %2").arg(dataset, dir);
}

QStringList recentModels() {
  QStringList models = QSettings().value(kModelsKey).toStringList();
  while (models.size() > kRecentLimit) models.removeLast();  // written by a build with a larger cap
  return models;
}

QList<RecentDataset> recentDatasets() {
  QSettings s;
  QList<RecentDataset> out;
  const int n = s.beginReadArray(kDatasetsKey);
  for (int i = 0; i < n && out.size() < kRecentLimit; ++i) {
    s.setArrayIndex(i);
    out.append(
        {s.value(QStringLiteral("dir")).toString(), s.value(QStringLiteral("dataset")).toString()});
  }
  s.endArray();
  return out;
}

void rememberModel(const QString& model) {
  if (model.trimmed().isEmpty()) return;
  QStringList models = recentModels();
  pushFront(models, model.trimmed());
  QSettings().setValue(kModelsKey, models);
}

void rememberDataset(const RecentDataset& dataset) {
  if (dataset.dataset.trimmed().isEmpty()) return;
  QList<RecentDataset> datasets = recentDatasets();
  pushFront(datasets, RecentDataset{dataset.dir.trimmed(), dataset.dataset.trimmed()});
  storeDatasets(datasets);
}

void rememberTrainConfig(const train::TrainConfig& config) {
  rememberModel(QString::fromStdString(config.model_name_or_path));
  QStringList names;
  for (const std::string& name : config.dataset) names << QString::fromStdString(name);
  rememberDataset({QString::fromStdString(config.dataset_dir), names.join(QLatin1Char(','))});
}

void clearRecent() {
  QSettings s;
  s.remove(kModelsKey);
  s.remove(kDatasetsKey);
}

}  // namespace tandem::ui
