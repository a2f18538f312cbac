// Builds any codec from a spec string, faiss-factory style:
//   make_compressor("sketch:rows=5,cols=500000,k=50000,p2=4,momentum=0.9", dim)
// Codecs register themselves (SKETCHSGD_REGISTER_CODEC in their own .cpp) with the options they
// accept; unknown names or keys and missing or out-of-range values throw InvalidArgument listing
// what is accepted.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <sketchsgd/compress/compressor.hpp>
#include <sketchsgd/compress/layout.hpp>

namespace sketchsgd {

struct OptionSpec {
  std::string key;
  std::string help;
  double fallback;  ///< default value
  double min;
  double max;
  bool integer = true;
  /// Names of the values min, min + 1, … (an enumeration): accepted in specs beside the numbers,
  /// and written in the canonical spec.
  std::vector<std::string> names = {};
  /// A budget the whole model shares (a count of coordinates or columns): a part of it gets its
  /// share (share_spec()).
  bool budget = false;
  /// A part's share of a budget, where it is a granule or more, is a whole number of granules
  /// (the sketch's columns: 4, so that its hash windows align for the vectorised path).
  uint32_t granule = 1;
};

/// Parsed, range-checked option values of one spec (every declared key present).
class Options {
 public:
  double number(const std::string& key) const;
  uint64_t integer(const std::string& key) const { return uint64_t(number(key)); }
  bool flag(const std::string& key) const { return number(key) != 0.0; }
  /// The spec's `layout=` (empty when none was given; only codecs that use one accept it).
  const Layout& layout() const { return layout_; }
  /// "name:key=value,..." with every option, in declaration order, then the layout if any.
  std::string canonical(const std::string& name, const std::vector<OptionSpec>& specs) const;

 private:
  friend class Registry;
  friend std::string share_spec(std::string_view spec, double share);
  friend std::vector<std::string> split_spec(std::string_view spec,
                                             std::span<const uint64_t> sizes);
  std::map<std::string, double> values_;
  Layout layout_;
};

enum class LayoutUse : uint8_t { None, Optional, Required };

/// A spec that takes one of its codec's paths, and how it trains the tests' problem (logistic
/// regression on 2,000 values, W = 4: tests/compress/training_test.cpp): the step size (most
/// codecs' steps are on the gradient's scale and train at the default; one whose step is not
/// states its own) and the options the problem adds (budgets that the automatic ones, sized for
/// any vector of 100 values, leave too small for a codec's one-round recovery). So a new codec is
/// trained with the others as soon as it registers, without a test to edit.
struct CodecExample {
  CodecExample(const char* s, float step = 1.0f, std::string options = {})
      : spec(s), lr(step), train(std::move(options)) {}
  CodecExample(std::string s, float step = 1.0f, std::string options = {})
      : spec(std::move(s)), lr(step), train(std::move(options)) {}
  std::string spec;
  float lr = 1.0f;
  std::string train;  ///< appended to spec for the training test ("" : none)
};

struct CodecEntry {
  std::string name;
  std::string summary;
  std::vector<OptionSpec> options;
  /// dim is validated before; build gets the canonical spec to store. Codecs without a CUDA
  /// implementation throw InvalidArgument for a GPU device.
  std::function<std::unique_ptr<Compressor>(const Options&, uint64_t dim, std::string spec,
                                            const Device& device)>
      build;
  /// Whether the codec takes `layout=` (the tensors of the vector; layout.hpp): not at all, as
  /// an option (topk: per-layer budgets, small tensors whole), or as a requirement (powersgd).
  LayoutUse layout = LayoutUse::None;
  /// Specs that between them take every path of the codec (each family of options that changes
  /// its wire format, its state or its phases), budgets left automatic (dim / 100) and without
  /// `layout=`, so they fit any vector of 100 values or more. Every codec-parametrised test, the
  /// fuzz target and the comparisons iterate over them (example_specs()): a new codec registers
  /// its examples and is tested with the others.
  std::vector<CodecExample> examples = {};
  /// For a codec that reads the layout: whether it would compress any of the options' layout
  /// (PowerSGD: a matrix worth factoring at its rank). Where it would not, the vector is better
  /// sent whole, and a framework that cuts a model into units sends such a unit so rather than
  /// build the codec (which refuses it). Unset: always.
  std::function<bool(const Options&)> compresses = {};
};

class Registry {
 public:
  static Registry& instance();
  void add(CodecEntry entry);
  const CodecEntry* find(std::string_view name) const;
  std::vector<const CodecEntry*> entries() const;
  std::unique_ptr<Compressor> make(std::string_view spec, uint64_t dim, const Device& device) const;
  /// The spec's entry and its parsed, range-checked options (dim not yet known).
  std::pair<const CodecEntry*, Options> parse(std::string_view spec) const;
  /// Human-readable list of codecs and their options (for errors and --help).
  std::string describe() const;

 private:
  std::map<std::string, CodecEntry, std::less<>> entries_;
};

/// Builds a codec for vectors of length dim from a spec string, on a device (gradients, steps and
/// parameters then live there).
std::unique_ptr<Compressor> make_compressor(std::string_view spec, uint64_t dim,
                                            const Device& device = Device::cpu());
/// The same for the vector made of a layout's tensors (dim = layout.size()): the layout becomes
/// the spec's `layout=` (InvalidArgument when the spec has one already or the codec uses none).
std::unique_ptr<Compressor> make_compressor(std::string_view spec, const Layout& layout,
                                            const Device& device = Device::cpu());
/// The canonical spec for a share ∈ (0, 1] of the model (a DDP bucket): its budget options (k,
/// cols) scaled by share, rounded half to even and at least 1 (0 stays 0: the codec's default);
/// share 1 validates a spec without building a codec. InvalidArgument for a bad spec or share.
std::string share_spec(std::string_view spec, double share = 1.0);
/// The canonical specs of a model cut into consecutive parts of these sizes (a sharded server's
/// ranges): each budget option (k, cols) split in proportion to the sizes by largest remainder,
/// so the parts' budgets add up to the whole's (each at least 1; 0 stays 0: the codec's default),
/// and the spec's layout cut at the parts' edges. InvalidArgument for a bad spec, a part of size
/// 0, sizes that do not add up to the layout, or an edge inside a tensor.
std::vector<std::string> split_spec(std::string_view spec, std::span<const uint64_t> sizes);
/// Whether spec's codec, given the vector made of layout's tensors, would compress any of it
/// (CodecEntry::compresses; true for a codec that reads no layout). InvalidArgument for a bad
/// spec, one with a layout already, or a layout the codec cannot take.
bool compresses_any(std::string_view spec, const Layout& layout);
/// The spec with `layout=` added when its codec requires one and it has none yet (what a program
/// that knows its model's shapes passes to server and workers alike); otherwise as is.
std::string complete_spec(std::string_view spec, const Layout& layout);

/// Every registered codec's examples (CodecEntry::examples), codecs in name order. With a layout
/// (the test's tensors), a codec that requires one gets it, and one that takes it as an option
/// is given each example twice, without and with it; without, codecs that require a layout are
/// left out.
std::vector<std::string> example_specs(const Layout& layout = {});
/// The same examples with their training steps.
std::vector<CodecExample> example_cases(const Layout& layout = {});

struct CodecRegistrar {
  explicit CodecRegistrar(CodecEntry entry) { Registry::instance().add(std::move(entry)); }
};

}  // namespace sketchsgd

#define SKETCHSGD_REGISTER_CODEC(var, ...)       \
  static const ::sketchsgd::CodecRegistrar var { \
    ::sketchsgd::CodecEntry __VA_ARGS__          \
  }
