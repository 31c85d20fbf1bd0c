#include "ui/theme.h"

#include <QAbstractAxis>
#include <QApplication>
#include <QChart>
#include <QLegend>
#include <QStyle>
#include <QStyleFactory>
#include <QStyleHints>

namespace tandem::ui {

namespace {

ThemeChoice current_theme = ThemeChoice::System;

// The style the platform chose, before a fixed theme switched to Fusion.
QString& platformStyleName() {
  static QString name = QApplication::style() ? QApplication::style()->name() : QString();
  return name;
}

#if QT_VERSION >= QT_VERSION_CHECK(6, 5, 0)
bool systemSchemeIsDark() {
  return QGuiApplication::styleHints()->colorScheme() == Qt::ColorScheme::Dark;
}
#endif

}  // namespace

QString themeChoiceKey(ThemeChoice choice) {
  switch (choice) {
    case ThemeChoice::System: return QStringLiteral("system");
    case ThemeChoice::Light: return QStringLiteral("light");
    case ThemeChoice::Dark: return QStringLiteral("dark");
  }
  return QStringLiteral("system");
}

ThemeChoice themeChoiceFromKey(const QString& key) {
  if (key == QLatin1String("light")) return ThemeChoice::Light;
  if (key == QLatin1String("dark")) return ThemeChoice::Dark;
  return ThemeChoice::System;
}

QPalette lightPalette() {
  std::unique_ptr<QStyle> fusion(QStyleFactory::create(QStringLiteral("Fusion")));
  return fusion ? fusion->standardPalette() : QPalette(Qt::white);
}

QPalette darkPalette() {
  // Base well below Window, so fields and check boxes (Base inside a Window-derived outline)
  // stand out from the window.
  const QColor window(53, 53, 53), base(28, 28, 28), text(230, 230, 230), muted(127, 127, 127);
  const QColor highlight(42, 130, 218);
  QPalette p;
  p.setColor(QPalette::Window, window);
  p.setColor(QPalette::WindowText, text);
  p.setColor(QPalette::Base, base);
  p.setColor(QPalette::AlternateBase, window);
  p.setColor(QPalette::ToolTipBase, QColor(25, 25, 25));
  p.setColor(QPalette::ToolTipText, text);
  p.setColor(QPalette::PlaceholderText, muted);
  p.setColor(QPalette::Text, text);
  p.setColor(QPalette::Button, window);
  p.setColor(QPalette::ButtonText, text);
  p.setColor(QPalette::BrightText, QColor(255, 90, 90));
  p.setColor(QPalette::Light, QColor(75, 75, 75));
  p.setColor(QPalette::Midlight, QColor(62, 62, 62));
  p.setColor(QPalette::Mid, QColor(45, 45, 45));
  p.setColor(QPalette::Dark, QColor(25, 25, 25));
  p.setColor(QPalette::Shadow, QColor(10, 10, 10));
  p.setColor(QPalette::Link, QColor(86, 180, 233));
  p.setColor(QPalette::LinkVisited, QColor(204, 121, 167));
  p.setColor(QPalette::Highlight, highlight);
  p.setColor(QPalette::HighlightedText, Qt::white);
  for (QPalette::ColorRole role : {QPalette::WindowText, QPalette::Text, QPalette::ButtonText})
    p.setColor(QPalette::Disabled, role, muted);
  p.setColor(QPalette::Disabled, QPalette::Highlight, QColor(80, 80, 80));
  return p;
}

bool isDark(const QPalette& palette) {
  return palette.color(QPalette::Window).lightness() <
         palette.color(QPalette::WindowText).lightness();
}

QColor problemColor(const QPalette& palette) {
  return isDark(palette) ? QColor(255, 128, 140) : QColor(176, 0, 32);
}

QString problemStyleSheet(const QPalette& palette) {
  return QStringLiteral("color: %1; font-weight: bold;").arg(problemColor(palette).name());
}

void applyTheme(ThemeChoice choice) {
  platformStyleName();  // remember the platform's style before the first switch
  current_theme = choice;
  const QString style =
      choice == ThemeChoice::System ? platformStyleName() : QStringLiteral("Fusion");
  if (QApplication::style()->name().compare(style, Qt::CaseInsensitive) != 0)
    QApplication::setStyle(style);
  switch (choice) {
    case ThemeChoice::Light: QApplication::setPalette(lightPalette()); break;
    case ThemeChoice::Dark: QApplication::setPalette(darkPalette()); break;
    case ThemeChoice::System: {
      QApplication::setPalette(QPalette());
#if QT_VERSION >= QT_VERSION_CHECK(6, 5, 0)
      // A desktop set to dark whose platform theme still hands out a light palette (Fusion on
      // GNOME): the colour-scheme hint wins.
      if (systemSchemeIsDark() && !isDark(QGuiApplication::palette()))
        QApplication::setPalette(darkPalette());
      static const bool following = [] {
        QObject::connect(QGuiApplication::styleHints(), &QStyleHints::colorSchemeChanged, qApp, [] {
          if (current_theme == ThemeChoice::System) applyTheme(current_theme);
        });
        return true;
      }();
      (void)following;
#endif
      break;
    }
  }
}

ThemeChoice currentTheme() { return current_theme; }

void applyChartPalette(QChart* chart, const QPalette& palette) {
  const QColor text = palette.color(QPalette::WindowText);
  // Opaque blends of text into the background (rather than translucent text): the same look,
  // and 8-bit screenshots do not dither them into dots.
  const QColor base = palette.color(QPalette::Base);
  auto blend = [&](double t) {
    return QColor::fromRgbF(base.redF() + (text.redF() - base.redF()) * t,
                            base.greenF() + (text.greenF() - base.greenF()) * t,
                            base.blueF() + (text.blueF() - base.blueF()) * t);
  };
  const QColor grid = blend(0.22);
  const QColor axis_line = blend(0.55);
  chart->setBackgroundBrush(palette.brush(QPalette::Base));
  chart->setTitleBrush(text);
  chart->legend()->setLabelColor(text);
  for (QAbstractAxis* axis : chart->axes()) {
    axis->setLabelsColor(text);
    axis->setTitleBrush(text);
    axis->setLinePenColor(axis_line);
    axis->setGridLineColor(grid);
    axis->setMinorGridLineColor(grid);
  }
}

}  // namespace tandem::ui
