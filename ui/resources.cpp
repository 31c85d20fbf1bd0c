#include "ui/resources.h"

#include <QtCore/qglobal.h>

// Q_INIT_RESOURCE declares a function in the current namespace: it must be the global one.
static void initStudioQrc() { Q_INIT_RESOURCE(studio); }

namespace tandem::ui {

void initStudioResources() { initStudioQrc(); }

}  // namespace tandem::ui
