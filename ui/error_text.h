#pragma once
// How the studio shows a tandem::Error in place: what is wrong, then what to do about it.

#include <QString>

namespace tandem {
class Error;
}

namespace tandem::ui {

QString errorText(const Error& error);  // "message\n→ what to do"

}  // namespace tandem::ui
