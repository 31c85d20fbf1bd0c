// The runs page's Export… button: a completed run of the demo model with a (random, non-zero)
// adapter → the dialog opens with the run's adapter and base → a merged Hugging Face export is
// written on the dialog's worker thread, the progress bar reaches 100 %, and the merged weights
// differ from the base exactly where the adapter has LoRA. tests/cli/test_export_merge.py checks
// the numbers against transformers + peft and llama.cpp.

#include <QPushButton>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/io/safetensors.h"
#include "engine/model/lora_plan.h"
#include "engine/model/random_adapter_test_util.h"
#include "engine/store/run_store.h"
#include "tests/ui/ui_test_support.h"
#include "ui/export_dialog.h"
#include "ui/runs_view.h"

namespace tandem::ui {
namespace fs = std::filesystem;

namespace {

std::string readText(const fs::path& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

void replace(std::string& text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  if (at != std::string::npos) text.replace(at, from.size(), to);
}

bool sameBytes(const io::SafetensorsModel& a, const io::SafetensorsModel& b,
               const std::string& name) {
  const io::TensorView x = a.view(name), y = b.view(name);
  return x.bytes.size() == y.bytes.size() &&
         std::memcmp(x.bytes.data(), y.bytes.data(), x.bytes.size()) == 0;
}

}  // namespace

class ExportTest : public QObject {
  Q_OBJECT

 private slots:
  void exportButtonWritesAMergedModel();
};

void ExportTest::exportButtonWritesAMergedModel() {
  QTemporaryDir tmp;
  const StudioPaths paths = test::demoPaths(tmp);
  const fs::path root = tmp.path().toStdString();
  const fs::path model_dir = paths.demo_workdir / "model";
  const fs::path adapter_dir = root / "run-output";
  model::LoraPlan plan;
  plan.settings.rank = 4;
  plan.settings.alpha = 8;
  plan.targets = [](const std::string& name) { return !name.ends_with("mlp.gate"); };
  model::testing::writeRandomAdapter(model_dir, adapter_dir, plan, /*seed=*/3, 0.5, 0.3f);

  // A completed run whose output is that adapter, as the runs page lists it.
  std::string yaml = readText(paths.presets / "training" / "demo_lora_sft.yaml");
  replace(yaml, "model_name_or_path: demo-model", "model_name_or_path: " + model_dir.string());
  replace(yaml, "dataset_dir: resources/demo",
          "dataset_dir: " + (paths.resources / "demo").string());
  replace(yaml, "output_dir: demo-output", "output_dir: " + adapter_dir.string());
  store::RunStore store = store::RunStore::open(root / "runs.db");
  store::NewRun new_run;
  new_run.name = "demo";
  new_run.config_yaml = yaml;
  new_run.model = model_dir.string();
  new_run.dataset = "identity";
  new_run.output_dir = adapter_dir;
  const int64_t run = store.createRun(new_run);
  store.setStatus(run, store::RunStatus::Completed);

  RunsView view(&store);
  view.show();
  view.refresh();
  view.selectRuns({run});
  auto* button = view.findChild<QPushButton*>(QStringLiteral("export_run"));
  QVERIFY(button != nullptr);
  QVERIFY(button->isEnabled());
  QTest::mouseClick(button, Qt::LeftButton);
  auto* dialog = view.findChild<ExportDialog*>();
  QVERIFY(dialog != nullptr);
  QTRY_VERIFY(dialog->isVisible());
  // An HF base starts on the HF export; the default target is beside the adapter, named after
  // the format.
  QCOMPARE(dialog->output(), QString::fromStdString((adapter_dir / "merged-hf").string()));
  dialog->setFormat(QStringLiteral("gguf"));
  dialog->setQuant(QStringLiteral("q8_0"));
  QCOMPARE(dialog->output(), QString::fromStdString((adapter_dir / "merged-gguf-q8_0").string()));
  dialog->setFormat(QStringLiteral("hf"));
  const fs::path out = root / "merged";
  dialog->setOutput(QString::fromStdString(out.string()));
  QSignalSpy finished(dialog, &ExportDialog::exportFinished);
  QTest::mouseClick(dialog->findChild<QPushButton*>(QStringLiteral("export")), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 1, 300000);
  QVERIFY2(finished.front().at(0).toBool(), qPrintable(finished.front().at(1).toString()));
  QCOMPARE(dialog->progressPermille(), 1000);
  QCOMPARE(dialog->written(), out);
  for (const char* name : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    QVERIFY2(fs::exists(out / name), name);

  // LoRA targets changed, the rest is the base byte for byte.
  const io::SafetensorsModel base = io::SafetensorsModel::open(model_dir);
  const io::SafetensorsModel merged = io::SafetensorsModel::open(out);
  QCOMPARE(merged.names(), base.names());
  QVERIFY(!sameBytes(base, merged, "model.layers.0.self_attn.q_proj.weight"));
  QVERIFY(!sameBytes(base, merged, "model.layers.1.mlp.experts.3.down_proj.weight"));
  QVERIFY(sameBytes(base, merged, "model.layers.0.mlp.gate.weight"));
  QVERIFY(sameBytes(base, merged, "model.embed_tokens.weight"));

  // Exporting to the same folder again is refused in place, and the folder is kept.
  QTest::mouseClick(dialog->findChild<QPushButton*>(QStringLiteral("export")), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 2, 60000);
  QVERIFY(!finished.back().at(0).toBool());
  QVERIFY(finished.back().at(1).toString().contains(QStringLiteral("already exists")));
  QVERIFY(fs::exists(out / "model.safetensors"));

  // Stop right after Export: the export ends as cancelled between tensors, and neither the target
  // nor its temporary folder is left.
  const fs::path stopped = root / "stopped";
  dialog->setOutput(QString::fromStdString(stopped.string()));
  QTest::mouseClick(dialog->findChild<QPushButton*>(QStringLiteral("export")), Qt::LeftButton);
  QTest::mouseClick(dialog->findChild<QPushButton*>(QStringLiteral("stop")), Qt::LeftButton);
  QTRY_COMPARE_WITH_TIMEOUT(finished.count(), 3, 60000);
  QVERIFY(!finished.back().at(0).toBool());
  QVERIFY2(finished.back().at(1).toString().contains(QStringLiteral("cancelled")),
           qPrintable(finished.back().at(1).toString()));
  QVERIFY(!fs::exists(stopped));
  for (const fs::directory_entry& entry : fs::directory_iterator(root))
    QVERIFY2(entry.path().filename().string().find(".partial-") == std::string::npos,
             qPrintable(QString::fromStdString(entry.path().string())));
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::ExportTest)
#include "studio_export_test.moc"
