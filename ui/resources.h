#pragma once
// The studio's compiled-in resources (resources/studio.qrc: SVG icons). tandem_ui is a static
// library, so its resource initialiser must be called by the program that links it.

namespace tandem::ui {

void initStudioResources();  // once, after QApplication exists; repeated calls are harmless

}  // namespace tandem::ui
