#include "ui/error_text.h"

#include "engine/core/error.h"

namespace tandem::ui {

QString errorText(const Error& error) {
  QString text = QString::fromStdString(error.message());
  if (!error.whatToDo().empty())
    text += QStringLiteral("\n→ ") + QString::fromStdString(error.whatToDo());
  return text;
}

}  // namespace tandem::ui
