#pragma once
// The options of the commands that run a model (chat, serve, eval, debug), bound to the
// ModelRequest every product fills (engine/model/model_request.h); `tandem train` takes the same
// settings from its YAML. A new model option is a field there, a line in resolveModelOptions and
// a line here.

#include <CLI/CLI.hpp>

#include "engine/model/model_request.h"

namespace tandem::cli {

// --dtype, --device, --layer-devices, --placement, --experts-backend, --experts-format,
// --gpu-experts, --task-split.
void addModelOptions(CLI::App& command, model::ModelRequest& request);

// What only a forward-and-backward run takes: --head-device, --experts (mode),
// --experts-wt-policy, --gradient-checkpointing, --loss-chunk-tokens.
void addTrainingModelOptions(CLI::App& command, model::ModelRequest& request);

}  // namespace tandem::cli
