#include "ui/path_field.h"

#include <QFileDialog>
#include <QHBoxLayout>
#include <QLineEdit>
#include <QPushButton>

namespace tandem::ui {

QWidget* pathField(QLineEdit* edit, PathKind kind, const QString& title, const QString& filter,
                   const QString& button_text) {
  auto* row = new QWidget;
  auto* layout = new QHBoxLayout(row);
  layout->setContentsMargins(0, 0, 0, 0);
  auto* browse = new QPushButton(button_text.isEmpty() ? QObject::tr("Browse…") : button_text, row);
  layout->addWidget(edit, 1);
  layout->addWidget(browse);
  QObject::connect(browse, &QPushButton::clicked, row, [edit, kind, title, filter, row] {
    QString path;
    switch (kind) {
      case PathKind::Folder:
        path = QFileDialog::getExistingDirectory(row, title, edit->text());
        break;
      case PathKind::OpenFile:
        path = QFileDialog::getOpenFileName(row, title, edit->text(), filter);
        break;
      case PathKind::SaveFile:
        path = QFileDialog::getSaveFileName(row, title, edit->text(), filter, nullptr,
                                            QFileDialog::DontConfirmOverwrite);
        break;
    }
    if (!path.isEmpty()) edit->setText(path);
  });
  return row;
}

}  // namespace tandem::ui
