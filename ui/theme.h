#pragma once
// The studio's palette: follow the system (the platform theme's palette, and on Qt >= 6.5 its
// light/dark colour-scheme hint), or a fixed light or dark one. Qt Charts do not follow the
// application palette, so charts are recoloured from it (applyChartPalette).

#include <QColor>
#include <QPalette>
#include <QString>

class QChart;

namespace tandem::ui {

enum class ThemeChoice { System, Light, Dark };

QString themeChoiceKey(ThemeChoice choice);          // "system" | "light" | "dark", as stored
ThemeChoice themeChoiceFromKey(const QString& key);  // unknown text: System

QPalette lightPalette();  // Fusion's own
QPalette darkPalette();   // Fusion's roles on dark greys, blue highlight
// A palette whose window is darker than its text: what a dark theme looks like, whoever made it.
bool isDark(const QPalette& palette);

// Sets the application palette (and, for Light and Dark, the Fusion style, the one style that
// draws every role of a custom palette on each platform). System returns to the platform's style
// and an empty palette, which Qt resolves against the platform theme on every theme change.
void applyTheme(ThemeChoice choice);
ThemeChoice currentTheme();

// Text that names a problem: dark red on a light window, a light red that reads on a dark one.
QColor problemColor(const QPalette& palette);
QString problemStyleSheet(const QPalette& palette);  // "color: …; font-weight: bold;"

// Background, title, axes, grid and legend of `chart` from `palette`; series keep their colours.
void applyChartPalette(QChart* chart, const QPalette& palette);

}  // namespace tandem::ui
