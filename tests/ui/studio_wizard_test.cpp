// The fine-tune wizard driven like a user: every field filled by its widget, page by page, on the
// demo model. The config it produces must equal the hand-written demo preset as the engine parses
// it, and so must its YAML; bad input must be reported on the page and keep Next disabled.

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QLabel>
#include <QLineEdit>
#include <QSpinBox>
#include <QTest>
#include <QTextBlock>
#include <QTextBrowser>
#include <QTextDocument>

#include "engine/chat/chat_template.h"
#include "engine/chat/supervised_encoder.h"
#include "engine/chat/tokenizer_encoder.h"
#include "engine/io/tokenizer.h"
#include "engine/train/dataset.h"
#include "tests/ui/ui_test_support.h"
#include "ui/host_machine.h"
#include "ui/machine_info.h"
#include "ui/resources.h"
#include "ui/wizard_pages.h"

namespace tandem::ui {

class WizardTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void producesTheHandWrittenConfig();
  void pagesSayWhatIsWrong();
  void datasetPageColoursTrainedTokens();

 private:
  template <typename W>
  W* field(FineTuneWizard& wizard, const char* key) {
    W* w = wizard.findChild<W*>(QString::fromLatin1(key));
    if (!w) qFatal("no widget for %s", key);
    return w;
  }
  void typeInto(FineTuneWizard& wizard, const char* key, const QString& text) {
    QLineEdit* edit = field<QLineEdit>(wizard, key);
    edit->clear();
    QTest::keyClicks(edit, text);
  }
  // Waits until the pages show what their inputs say (their engine calls run on workers).
  static bool settled(const FineTuneWizard& wizard) {
    return QTest::qWaitFor([&] { return !wizard.isBusy(); }, 30000);
  }

  QTemporaryDir tmp_;
  StudioPaths paths_;
  HostMachine host_;
};

void WizardTest::initTestCase() {
  initStudioResources();
  QVERIFY(tmp_.isValid());
  paths_ = test::demoPaths(tmp_);
  QTRY_VERIFY_WITH_TIMEOUT(host_.isProbed(), 60000);
  QVERIFY2(host_.problem().isEmpty(), qPrintable(host_.problem()));
}

void WizardTest::producesTheHandWrittenConfig() {
  const std::filesystem::path output =
      std::filesystem::path(tmp_.path().toStdString()) / "wizard-out";
  train::TrainConfig hand = test::demoConfig(paths_, output);
  hand.experts_format = "bf16";
  hand.experts_wt_policy = "background";
  hand.gpu_experts = "3";
  hand.experts_mode = "gpu-offload";
  hand.packing = true;
  hand.neat_packing = true;

  FineTuneWizard wizard(host_, paths_);  // starts from LLaMA-Factory's defaults
  wizard.show();
  QVERIFY(QTest::qWaitForWindowExposed(&wizard));
  QCOMPARE(wizard.currentId(), int(FineTuneWizard::ModelPageId));
  QVERIFY(!wizard.currentPage()->isComplete());  // no model yet
  typeInto(wizard, "model_name_or_path", QString::fromStdString(hand.model_name_or_path));
  QTRY_VERIFY(wizard.currentPage()->isComplete());
  QVERIFY(wizard.modelSummary().has_value());
  QCOMPARE(wizard.modelSummary()->config.num_experts, 16);
  {
    // The routed experts' RAM as stored (the demo model is fp32) and as bf16, as int8 / int4 would
    // hold them (hand formula: int8 one byte a weight + an f32 scale per output row; int4 18 bytes
    // per 32 weights).
    const io::ModelConfig& c = wizard.modelSummary()->config;
    const uint64_t per_layer_weights =
        uint64_t(c.num_experts) * 3 * c.hidden_size * c.moe_intermediate_size;
    const uint64_t layers = uint64_t(c.numMoeLayers());
    const uint64_t int8_scales =
        uint64_t(c.num_experts) * (2 * c.moe_intermediate_size + c.hidden_size) * 4;
    const QString text = wizard.findChild<QLabel*>(QStringLiteral("model_summary"))->text();
    QVERIFY2(text.contains(QStringLiteral("Experts in RAM")), qPrintable(text));
    QVERIFY2(text.contains(bytesText(layers * per_layer_weights * 4) + " as fp32 (as stored)"),
             qPrintable(text));
    QVERIFY2(text.contains(bytesText(layers * per_layer_weights * 2) + " as bf16"),
             qPrintable(text));
    QVERIFY2(text.contains(bytesText(layers * (per_layer_weights + int8_scales)) + " as int8"),
             qPrintable(text));
    QVERIFY2(text.contains(bytesText(layers * per_layer_weights / 32 * 18) + " as int4"),
             qPrintable(text));
  }
  wizard.next();

  QCOMPARE(wizard.currentId(), int(FineTuneWizard::HardwarePageId));
  QVERIFY(wizard.currentPage()->isComplete());
  field<QComboBox>(wizard, "experts_format")->setCurrentText(QStringLiteral("bf16"));
  field<QComboBox>(wizard, "experts_wt_policy")->setCurrentText(QStringLiteral("background"));
  QCOMPARE(field<QSpinBox>(wizard, "gpu_experts")->text(),
           field<QSpinBox>(wizard, "gpu_experts")->specialValueText());
  QCOMPARE(field<QSpinBox>(wizard, "gpu_experts")->maximum(), 16);  // the model's experts
  field<QSpinBox>(wizard, "gpu_experts")->setValue(3);
  QCOMPARE(field<QComboBox>(wizard, "experts_mode")->currentData().toString(),
           QStringLiteral("cpu"));
  field<QComboBox>(wizard, "experts_mode")
      ->setCurrentIndex(
          field<QComboBox>(wizard, "experts_mode")->findData(QStringLiteral("gpu-offload")));
  wizard.next();

  QCOMPARE(wizard.currentId(), int(FineTuneWizard::DatasetPageId));
  typeInto(wizard, "dataset_dir", QString::fromStdString(hand.dataset_dir));
  field<QComboBox>(wizard, "dataset")->setCurrentText(QStringLiteral("identity"));
  field<QComboBox>(wizard, "template")->setCurrentText(QStringLiteral("qwen3_nothink"));
  field<QSpinBox>(wizard, "cutoff_len")->setValue(128);
  // Neat packing turns packing on with it, as LLaMA-Factory's neat_packing does.
  QVERIFY(!field<QCheckBox>(wizard, "packing")->isChecked());
  field<QCheckBox>(wizard, "neat_packing")->setChecked(true);
  QVERIFY(field<QCheckBox>(wizard, "packing")->isChecked());
  QVERIFY(settled(wizard));
  QVERIFY(wizard.currentPage()->isComplete());
  wizard.next();

  QCOMPARE(wizard.currentId(), int(FineTuneWizard::TrainingPageId));
  typeInto(wizard, "lora_target", QStringLiteral("all"));
  field<QSpinBox>(wizard, "lora_rank")->setValue(8);
  field<QSpinBox>(wizard, "lora_alpha")->setValue(16);
  typeInto(wizard, "output_dir", QString::fromStdString(output.string()));
  field<QSpinBox>(wizard, "logging_steps")->setValue(5);
  field<QSpinBox>(wizard, "save_steps")->setValue(40);
  field<QSpinBox>(wizard, "save_total_limit")->setValue(2);
  field<QCheckBox>(wizard, "plot_loss")->setChecked(true);
  field<QSpinBox>(wizard, "per_device_train_batch_size")->setValue(8);
  field<QSpinBox>(wizard, "gradient_accumulation_steps")->setValue(1);
  typeInto(wizard, "learning_rate", QStringLiteral("3.0e-3"));
  field<QDoubleSpinBox>(wizard, "num_train_epochs")->setValue(30);
  field<QComboBox>(wizard, "lr_scheduler_type")->setCurrentText(QStringLiteral("cosine"));
  field<QDoubleSpinBox>(wizard, "warmup_ratio")->setValue(0.05);
  field<QDoubleSpinBox>(wizard, "max_grad_norm")->setValue(1.0);
  field<QSpinBox>(wizard, "seed")->setValue(42);
  field<QCheckBox>(wizard, "gradient_checkpointing")->setChecked(false);
  QVERIFY(wizard.currentPage()->isComplete());
  wizard.next();

  QCOMPARE(wizard.currentId(), int(FineTuneWizard::ReviewPageId));
  QVERIFY(wizard.currentPage()->isComplete());
  auto* review = static_cast<ReviewPage*>(wizard.currentPage());
  QCOMPARE(review->yamlText(), QString::fromStdString(train::toYaml(hand)));

  const train::TrainConfig made = wizard.config();
  if (!(made == hand)) {
    QCOMPARE(QString::fromStdString(train::toYaml(made)),
             QString::fromStdString(train::toYaml(hand)));
  }
  QVERIFY(made == hand);
  QVERIFY(train::parseTrainConfig(wizard.yaml().toStdString(), "wizard yaml") == hand);
  QCOMPARE(train::configFingerprint(made), train::configFingerprint(hand));

  // Opening that config again shows the same choices (a count of GPU experts, not auto; offload
  // mode).
  FineTuneWizard reopened(host_, paths_);
  reopened.loadConfig(hand);
  QCOMPARE(field<QSpinBox>(reopened, "gpu_experts")->value(), 3);
  QCOMPARE(field<QComboBox>(reopened, "experts_mode")->currentData().toString(),
           QStringLiteral("gpu-offload"));
  QVERIFY(field<QCheckBox>(reopened, "neat_packing")->isChecked());
  QVERIFY(reopened.config() == hand);
  // Unpacking drops the neat variant too.
  field<QCheckBox>(reopened, "packing")->setChecked(false);
  QVERIFY(!field<QCheckBox>(reopened, "neat_packing")->isChecked());
}

void WizardTest::pagesSayWhatIsWrong() {
  FineTuneWizard wizard(host_, paths_);
  wizard.loadConfig(
      test::demoConfig(paths_, std::filesystem::path(tmp_.path().toStdString()) / "bad-out"));
  wizard.show();
  QVERIFY(QTest::qWaitForWindowExposed(&wizard));
  QVERIFY(settled(wizard));
  QVERIFY(wizard.currentPage()->isComplete());

  // A folder without a model: the page names the missing file and refuses Next.
  typeInto(wizard, "model_name_or_path", tmp_.path());
  QVERIFY(settled(wizard));
  QVERIFY(!wizard.currentPage()->isComplete());
  bool said = false;
  for (QLabel* label : wizard.currentPage()->findChildren<QLabel*>()) {
    said = said || (label->isVisible() && label->text().contains(QStringLiteral("config.json")));
  }
  QVERIFY2(said, "the model page does not say that config.json is missing");
  typeInto(wizard, "model_name_or_path",
           QString::fromStdString((paths_.demo_workdir / "model").string()));
  QTRY_VERIFY(wizard.currentPage()->isComplete());
  wizard.next();
  wizard.next();

  // An unknown dataset name.
  field<QComboBox>(wizard, "dataset")->setCurrentText(QStringLiteral("no_such_dataset"));
  QVERIFY(settled(wizard));
  QVERIFY(!wizard.currentPage()->isComplete());
  field<QComboBox>(wizard, "dataset")->setCurrentText(QStringLiteral("identity"));
  QVERIFY(settled(wizard));
  QVERIFY(wizard.currentPage()->isComplete());
  wizard.next();

  // A learning rate that is not positive, and no output folder.
  field<QLineEdit>(wizard, "learning_rate")->setText(QStringLiteral("0"));
  QVERIFY(!wizard.currentPage()->isComplete());
  field<QLineEdit>(wizard, "learning_rate")->setText(QStringLiteral("1e-4"));
  QVERIFY(wizard.currentPage()->isComplete());
  field<QLineEdit>(wizard, "output_dir")->clear();
  QVERIFY(!wizard.currentPage()->isComplete());
}

void WizardTest::datasetPageColoursTrainedTokens() {
  const train::TrainConfig config =
      test::demoConfig(paths_, std::filesystem::path(tmp_.path().toStdString()) / "out3");
  FineTuneWizard wizard(host_, paths_);
  wizard.loadConfig(config);
  wizard.show();
  QVERIFY(QTest::qWaitForWindowExposed(&wizard));
  wizard.next();
  wizard.next();
  auto* page = static_cast<DatasetPage*>(wizard.currentPage());
  QVERIFY(settled(wizard));
  QVERIFY(page->isComplete());
  QCOMPARE(page->previewRows(), 32);
  QVERIFY2(page->skippedText().startsWith(QStringLiteral("32 rows usable, 0 skipped")),
           qPrintable(page->skippedText()));

  // The reference: the engine's own encoding of row 0, decoded token by token.
  train::DatasetReport report;
  const auto rows = train::loadDatasets(config.dataset_dir, config.dataset, std::nullopt, report);
  const io::Tokenizer tokenizer = io::Tokenizer::load(config.model_name_or_path);
  const chat::ChatTemplate& chat_template = chat::templateByName(config.template_name);
  const chat::TokenizerEncoder encoder(tokenizer, chat_template);
  chat::SupervisedOptions options;
  options.cutoff_len = config.cutoff_len;
  const chat::EncodedSample sample =
      chat::encodeSupervised(rows[0], chat_template, encoder, options);
  QString trained, masked;
  for (size_t i = 0; i < sample.input_ids.size(); ++i) {
    const QString piece =
        QString::fromStdString(tokenizer.decode(std::span<const int32_t>(&sample.input_ids[i], 1)));
    (sample.labels[i] == chat::kIgnoreIndex ? masked : trained) += piece;
  }
  QVERIFY(!trained.isEmpty() && !masked.isEmpty());

  // What the page shows, split by background colour.
  QTextDocument doc;
  doc.setHtml(page->renderedHtml());
  QString shown_trained, shown_masked;
  for (QTextBlock block = doc.begin(); block.isValid(); block = block.next()) {
    for (auto it = block.begin(); !it.atEnd(); ++it) {
      const QTextFragment f = it.fragment();
      const QColor bg = f.charFormat().background().color();
      if (bg == QColor(QStringLiteral("#c8f0d0")) || bg == QColor(QStringLiteral("#a6e3b5")))
        shown_trained += f.text();
      if (bg == QColor(QStringLiteral("#e4e4e4")) || bg == QColor(QStringLiteral("#cfcfcf")))
        shown_masked += f.text();
    }
  }
  auto normal = [](QString s) {
    s.remove(QChar(u'↵'));
    s.remove(QLatin1Char('\n'));
    s.remove(QChar::LineSeparator);
    s.remove(QChar::ParagraphSeparator);
    return s;
  };
  QCOMPARE(normal(shown_trained), normal(trained));
  QCOMPARE(normal(shown_masked), normal(masked));
}

}  // namespace tandem::ui

QTEST_MAIN(tandem::ui::WizardTest)
#include "studio_wizard_test.moc"
