#include "engine/model/adapter_set.h"

#include <ATen/ATen.h>

#include <map>
#include <set>
#include <utility>

#include "engine/core/error.h"
#include "engine/experts/expert_layer.h"
#include "engine/io/gguf_model.h"
#include "engine/model/causal_lm.h"
#include "engine/model/checkpoint_dir.h"
#include "engine/model/gguf_lora.h"
#include "engine/model/model.h"
#include "engine/model/peft_adapter.h"

namespace tandem::model {

namespace fs = std::filesystem;

struct AdapterSet::Adapter {
  std::string name;
  gpu::LoraSettings settings;
  std::map<std::string, std::pair<at::Tensor, at::Tensor>>
      dense;  // module -> A [r, in], B [out, r]
  // mlp name -> the routed experts' LoRA; held here while the adapter is not active, inside the
  // expert engine while it is.
  std::map<std::string, experts::ExpertLora> experts;
  // mlp name -> its LoRA experts (lora_experts.h) on the layer's device; set on the block while
  // the adapter is active.
  std::map<std::string, LoraExperts> lora_experts;
};

AdapterSet::AdapterSet(Model& model) : model_(model) {}
AdapterSet::~AdapterSet() = default;

namespace {

std::string shapeText(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

}  // namespace

void AdapterSet::add(const std::string& name, const fs::path& dir, AdapterMode mode) {
  if (name.empty() || name == "base") throw Error("an adapter needs a name other than \"base\"");
  if (has(name))
    throw Error("an adapter named \"" + name + "\" is already loaded", "choose another name");
  if (merged_ || (mode == AdapterMode::Merged && !adapters_.empty())) {
    throw Error("a merged adapter must be the only adapter",
                "load the adapters unmerged to switch between them");
  }
  // A llama.cpp LoRA GGUF file as it is; a folder: the adapter in it or its last checkpoint.
  std::error_code ec;
  const fs::path source =
      io::isGgufPath(dir) && fs::is_regular_file(dir, ec) ? dir : model::resolveAdapterDir(dir);
  const model::PeftAdapter peft = model::readAdapterAt(source, model_.config());
  auto adapter = std::make_unique<Adapter>();
  adapter->name = name;
  adapter->settings = peft.settings;
  adapter->settings.dropout = 0;
  std::set<std::string> used;
  model_.lm().visitLinears([&](const std::string& module, gpu::LoraLinear& linear) {
    auto a = peft.a.find(module);
    if (a == peft.a.end()) return;
    const at::Tensor& b = peft.b.at(module);
    const int64_t r = peft.settings.rank;
    if (a->second.sizes() != at::IntArrayRef{r, linear.inFeatures()} ||
        b.sizes() != at::IntArrayRef{linear.outFeatures(), r}) {
      throw Error(source.string() + ": " + module + " has LoRA A " + shapeText(a->second) +
                      " and B " + shapeText(b) + ", but the layer needs [" + std::to_string(r) +
                      ", " + std::to_string(linear.inFeatures()) + "] and [" +
                      std::to_string(linear.outFeatures()) + ", " + std::to_string(r) + "]",
                  "the adapter was made for another model, or the file is damaged");
    }
    // On the layer's own device: a model split over devices has its layers' LoRA on each.
    const auto float_on = at::TensorOptions().dtype(at::kFloat).device(linear.weight().device());
    adapter->dense[module] = {a->second.to(float_on).contiguous(), b.to(float_on).contiguous()};
    used.insert(module);
  });
  model_.lm().visitMoeBlocks([&](const std::string& mlp, model::MoeBlock& block) {
    const experts::ExpertLayerSpec& spec = block.experts->spec();
    auto key = [&](experts::ExpertProj proj, int64_t e) {
      return mlp + ".experts." + std::to_string(e) + "." +
             std::string(experts::expertProjName(proj));
    };
    experts::ExpertLoraSpec lora_spec;
    bool* targets[] = {&lora_spec.gate, &lora_spec.up, &lora_spec.down};
    for (int p = 0; p < experts::kExpertProjCount; ++p) {
      for (int64_t e = 0; e < spec.num_experts && !*targets[p]; ++e) {
        *targets[p] = peft.a.count(key(static_cast<experts::ExpertProj>(p), e)) > 0;
      }
    }
    if (!lora_spec.gate && !lora_spec.up && !lora_spec.down) return;
    lora_spec.rank = peft.expert_rank > 0 ? peft.expert_rank : peft.settings.rank;
    lora_spec.scale = static_cast<float>(peft.settings.scale());
    experts::ExpertLora lora(spec, lora_spec);
    for (int p = 0; p < experts::kExpertProjCount; ++p) {
      const auto proj = static_cast<experts::ExpertProj>(p);
      for (int64_t e = 0; e < spec.num_experts && lora.targets(proj); ++e) {
        auto a = peft.a.find(key(proj, e));
        if (a == peft.a.end()) continue;  // an expert the adapter leaves alone: zero delta
        const at::Tensor& b = peft.b.at(key(proj, e));
        if (a->second.sizes() != at::IntArrayRef{lora.rank(), lora.inFeatures(proj)} ||
            b.sizes() != at::IntArrayRef{lora.outFeatures(proj), lora.rank()}) {
          throw Error(source.string() + ": " + key(proj, e) + " has LoRA A " +
                          shapeText(a->second) + " and B " + shapeText(b) +
                          ", which do not fit the expert",
                      "the adapter was made for another model, or the file is damaged");
        }
        const at::Tensor a_cpu = a->second.to(at::kFloat).contiguous();
        const at::Tensor b_cpu = b.to(at::kFloat).contiguous();
        lora.loadExpert(proj, e, a_cpu.data_ptr<float>(), b_cpu.data_ptr<float>());
        used.insert(key(proj, e));
      }
    }
    adapter->experts.emplace(mlp, std::move(lora));
  });
  if (peft.lora_experts.defined()) {
    model_.lm().visitMoeBlocks([&](const std::string& mlp, model::MoeBlock& block) {
      adapter->lora_experts.emplace(mlp,
                                    LoraExperts::fromPaths(peft.lora_experts.layers.at(mlp),
                                                           block.router.gate.weight().device()));
    });
  }
  for (const auto& [module, a] : peft.a) {
    if (!used.count(module)) {
      throw Error(source.string() + ": the adapter has LoRA weights for " + module +
                      ", which this model does not have",
                  "use the adapter with the model it was trained on");
    }
  }
  if (mode == AdapterMode::Merged) {
    activate("");
    swapIn(*adapter);
    model_.lm().visitLinears(
        [](const std::string&, gpu::LoraLinear& linear) { linear.mergeLora(); });
    adapter->dense.clear();
    merged_ = true;
    active_ = name;
  }
  adapters_.push_back(std::move(adapter));
}

AdapterSet::Adapter* AdapterSet::find(std::string_view name) {
  for (auto& a : adapters_) {
    if (a->name == name) return a.get();
  }
  return nullptr;
}

bool AdapterSet::has(std::string_view name) const {
  for (const auto& a : adapters_) {
    if (a->name == name) return true;
  }
  return false;
}

std::vector<std::string> AdapterSet::names() const {
  std::vector<std::string> out;
  for (const auto& a : adapters_) out.push_back(a->name);
  return out;
}

void AdapterSet::activate(std::string_view requested) {
  const std::string name(requested == "base" ? std::string_view() : requested);
  if (name == active_) return;
  if (merged_) {
    throw Error(
        name.empty()
            ? "the base model is not available: adapter \"" + active_ + "\" is merged into it"
            : "unknown adapter \"" + name + "\"; the model serves only the merged adapter \"" +
                  active_ + "\"",
        "load the adapter unmerged to switch between base and adapter");
  }
  Adapter* next = name.empty() ? nullptr : find(name);
  if (!name.empty() && !next) {
    std::string known = "base";
    for (const auto& a : adapters_) known += ", " + a->name;
    throw Error("unknown adapter \"" + name + "\"", "choose one of: " + known);
  }
  if (!active_.empty()) swapOut(*find(active_));
  if (next) swapIn(*next);
  active_ = name;
}

void AdapterSet::swapIn(Adapter& adapter) {
  model_.lm().visitLinears([&](const std::string& module, gpu::LoraLinear& linear) {
    auto it = adapter.dense.find(module);
    if (it == adapter.dense.end()) return;
    linear.clearLora();
    linear.attachLora(adapter.settings, it->second.first, it->second.second);
  });
  model_.lm().visitMoeBlocks([&](const std::string& mlp, model::MoeBlock& block) {
    auto it = adapter.experts.find(mlp);
    if (it != adapter.experts.end()) std::swap(block.experts->lora(), it->second);
    auto le = adapter.lora_experts.find(mlp);
    if (le != adapter.lora_experts.end()) block.lora_experts = le->second;
  });
}

void AdapterSet::swapOut(Adapter& adapter) {
  model_.lm().visitLinears([&](const std::string& module, gpu::LoraLinear& linear) {
    if (adapter.dense.count(module)) linear.clearLora();
  });
  model_.lm().visitMoeBlocks([&](const std::string& mlp, model::MoeBlock& block) {
    auto it = adapter.experts.find(mlp);
    if (it != adapter.experts.end()) std::swap(block.experts->lora(), it->second);
    if (adapter.lora_experts.count(mlp)) block.lora_experts = LoraExperts();
  });
}

}  // namespace tandem::model
