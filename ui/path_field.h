#pragma once
// A path field: a line edit with a "Browse…" button beside it that opens the file dialog for a
// folder or a file and writes the choice into the edit. Every path input of the studio uses it.

#include <QString>

class QLineEdit;
class QWidget;

namespace tandem::ui {

enum class PathKind { Folder, OpenFile, SaveFile };

// Returns the row (edit + button; the edit takes the spare width). `filter` is for files
// ("Data (*.json *.csv)"). A SaveFile dialog does not ask before naming an existing file.
QWidget* pathField(QLineEdit* edit, PathKind kind, const QString& title, const QString& filter = {},
                   const QString& button_text = {});

}  // namespace tandem::ui
