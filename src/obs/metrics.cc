#include "obs/metrics.h"

#include <dirent.h>
#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

namespace fathom::obs {

// ---------------------------------------------------------------------------------------------------------------
// Formatting and names.

std::string FormatMetricValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Integral values below 2^53 print as integers ("3", not "3.0" or "3e+00"); 2^53 bounds the exact range.
  if (v == std::trunc(v) && std::fabs(v) < 9007199254740992.0) return fmt::format("{}", static_cast<int64_t>(v));
  return fmt::format("{}", v);  // shortest representation that round-trips; Go's ParseFloat reads it
}

std::string EscapeLabelValue(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

namespace {

bool IsNameStart(char c, bool colon) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || (colon && c == ':');
}
bool IsNameChar(char c, bool colon) {
  return IsNameStart(c, colon) || (c >= '0' && c <= '9');
}
bool IsValidName(std::string_view name, bool colon) {
  if (name.empty() || !IsNameStart(name[0], colon)) return false;
  return std::all_of(name.begin() + 1, name.end(), [&](char c) { return IsNameChar(c, colon); });
}

std::string_view TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// The sample names a family writes: histograms add _bucket, _sum and _count.
std::vector<std::string> SampleNames(const std::string& name, MetricType type) {
  if (type != MetricType::kHistogram) return {name};
  return {name, name + "_bucket", name + "_sum", name + "_count"};
}

// `{a="x",b="y"}`, with `le` appended for histogram buckets; empty when there is nothing to write.
std::string LabelString(const std::vector<std::string>& names, const LabelValues& values, std::string_view le = {}) {
  if (names.empty() && le.empty()) return {};
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    out += names[i];
    out += "=\"";
    out += EscapeLabelValue(values[i]);
    out += '"';
  }
  if (!le.empty()) {
    if (!names.empty()) out += ',';
    out += "le=\"";
    out += le;
    out += '"';
  }
  out += '}';
  return out;
}

void AppendSample(std::string& out, std::string_view name, const std::string& labels, double value) {
  out += name;
  out += labels;
  out += ' ';
  out += FormatMetricValue(value);
  out += '\n';
}

}  // namespace

bool IsValidMetricName(std::string_view name) {
  return IsValidName(name, /*colon=*/true);
}

bool IsValidLabelName(std::string_view name) {
  return IsValidName(name, /*colon=*/false) && !name.starts_with("__");
}

// ---------------------------------------------------------------------------------------------------------------
// Children.

double Counter::Value() const {
  const uint64_t i = int_part_.load(std::memory_order_relaxed);
  const double d = double_part_.load(std::memory_order_relaxed);
  return static_cast<double>(i) + d;
}

Gauge::~Gauge() {
  delete callback_.load(std::memory_order_acquire);
}

double Gauge::Value() const {
  const std::function<double()>* fn = callback_.load(std::memory_order_acquire);
  return fn != nullptr ? (*fn)() : value_.load(std::memory_order_relaxed);
}

Histogram::Histogram(std::span<const double> bounds)
    : bounds_(bounds.begin(), bounds.end()), buckets_(new std::atomic<uint64_t>[bounds.size() + 1]) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    FATHOM_CHECK(std::isfinite(bounds_[i]), "histogram bound {} is not finite (+Inf is implicit)", bounds_[i]);
    if (i > 0) FATHOM_CHECK(bounds_[i - 1] < bounds_[i], "histogram bounds must increase strictly");
  }
  for (size_t i = 0; i <= bounds_.size(); ++i) buckets_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double v) {
  // First bound >= v: `le` is inclusive. NaN compares false with everything and goes to +Inf, as in client_golang.
  const size_t i = std::isnan(v)
                       ? bounds_.size()
                       : static_cast<size_t>(std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin());
  buckets_[i].fetch_add(1, std::memory_order_relaxed);
  sum_.fetch_add(v, std::memory_order_relaxed);
}

Histogram::Snapshot Histogram::Read() const {
  Snapshot s;
  s.bounds = bounds_;
  s.cumulative.resize(bounds_.size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    running += buckets_[i].load(std::memory_order_relaxed);
    s.cumulative[i] = running;
  }
  s.count = running;
  s.sum = sum_.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Families.

void FamilyBase::RenderHeader(std::string& out) const {
  out += "# HELP ";
  out += name_;
  out += ' ';
  out += EscapeHelp(help_);
  out += "\n# TYPE ";
  out += name_;
  out += ' ';
  out += TypeName(type_);
  out += '\n';
}

template <typename T>
Family<T>::Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
                  std::vector<double> bounds)
    : FamilyBase(std::move(name), std::move(help), type, std::move(label_names)), bounds_(std::move(bounds)) {
  if (label_names_.empty()) GetOrCreate({});  // an unlabelled family shows its zero from the first scrape
}

template <typename T>
T& Family<T>::GetOrCreate(const LabelValues& values) {
  FATHOM_CHECK(values.size() == label_names_.size(), "{}: {} label values for {} label names", name_, values.size(),
               label_names_.size());
  std::lock_guard lock(mu_);
  auto it = children_.find(values);
  if (it == children_.end()) {
    std::unique_ptr<T> child;
    if constexpr (std::is_same_v<T, Histogram>) {
      child = std::make_unique<Histogram>(bounds_);
    } else {
      child = std::make_unique<T>();
    }
    it = children_.emplace(values, std::move(child)).first;
  }
  return *it->second;
}

template <typename T>
T& Family<T>::WithLabels(const LabelValues& values) {
  return GetOrCreate(values);
}

template <typename T>
T& Family<T>::Get() {
  FATHOM_CHECK(label_names_.empty(), "{} has labels: use WithLabels", name_);
  return GetOrCreate({});
}

template <typename T>
T& Family<T>::SetCallback(const LabelValues& values, std::function<double()> fn) requires std::is_same_v<T, Gauge> {
  FATHOM_CHECK(fn != nullptr);
  T& g = GetOrCreate(values);
  // (if constexpr: clang 14 instantiates constrained members in an explicit instantiation of Family<Counter>.)
  if constexpr (std::is_same_v<T, Gauge>) {
    auto* owned = new std::function<double()>(std::move(fn));
    const std::function<double()>* expected = nullptr;
    if (!g.callback_.compare_exchange_strong(expected, owned, std::memory_order_acq_rel)) {
      delete owned;
      FATHOM_CHECK(false, "{}: a callback is already set for these labels", name_);
    }
  }
  return g;
}

template <typename T>
void Family<T>::Render(std::string& out) const {
  RenderHeader(out);
  std::lock_guard lock(mu_);
  for (const auto& [values, child] : children_) {
    if constexpr (std::is_same_v<T, Histogram>) {
      const Histogram::Snapshot s = child->Read();
      const std::string bucket_name = name_ + "_bucket";
      for (size_t i = 0; i < s.bounds.size(); ++i) {
        AppendSample(out, bucket_name, LabelString(label_names_, values, FormatMetricValue(s.bounds[i])),
                     static_cast<double>(s.cumulative[i]));
      }
      AppendSample(out, bucket_name, LabelString(label_names_, values, "+Inf"), static_cast<double>(s.count));
      const std::string labels = LabelString(label_names_, values);
      AppendSample(out, name_ + "_sum", labels, s.sum);
      AppendSample(out, name_ + "_count", labels, static_cast<double>(s.count));
    } else {
      AppendSample(out, name_, LabelString(label_names_, values), child->Value());
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

// ---------------------------------------------------------------------------------------------------------------
// Registry.

void Registry::CheckNewFamily(const std::string& name, MetricType type,
                              const std::vector<std::string>& label_names) const {
  FATHOM_CHECK(IsValidMetricName(name), "invalid metric name '{}'", name);
  std::set<std::string_view> seen;
  for (const std::string& label : label_names) {
    FATHOM_CHECK(IsValidLabelName(label), "{}: invalid label name '{}'", name, label);
    FATHOM_CHECK(type != MetricType::kHistogram || label != "le", "{}: 'le' is reserved in histograms", name);
    FATHOM_CHECK(seen.insert(label).second, "{}: label '{}' given twice", name, label);
  }
  const std::vector<std::string> new_names = SampleNames(name, type);
  for (const auto& family : families_) {
    for (const std::string& existing : SampleNames(family->name(), family->type())) {
      FATHOM_CHECK(std::find(new_names.begin(), new_names.end(), existing) == new_names.end(),
                   "metric '{}' clashes with the registered '{}'", name, family->name());
    }
  }
}

CounterFamily& Registry::AddCounter(std::string name, std::string help, std::vector<std::string> label_names) {
  std::lock_guard lock(mu_);
  CheckNewFamily(name, MetricType::kCounter, label_names);
  auto family =
      std::make_unique<CounterFamily>(std::move(name), std::move(help), MetricType::kCounter, std::move(label_names));
  CounterFamily& ref = *family;
  families_.push_back(std::move(family));
  return ref;
}

GaugeFamily& Registry::AddGauge(std::string name, std::string help, std::vector<std::string> label_names) {
  std::lock_guard lock(mu_);
  CheckNewFamily(name, MetricType::kGauge, label_names);
  auto family =
      std::make_unique<GaugeFamily>(std::move(name), std::move(help), MetricType::kGauge, std::move(label_names));
  GaugeFamily& ref = *family;
  families_.push_back(std::move(family));
  return ref;
}

HistogramFamily& Registry::AddHistogram(std::string name, std::string help, std::span<const double> bounds,
                                        std::vector<std::string> label_names) {
  std::lock_guard lock(mu_);
  CheckNewFamily(name, MetricType::kHistogram, label_names);
  auto family =
      std::make_unique<HistogramFamily>(std::move(name), std::move(help), MetricType::kHistogram,
                                        std::move(label_names), std::vector<double>(bounds.begin(), bounds.end()));
  HistogramFamily& ref = *family;
  families_.push_back(std::move(family));
  return ref;
}

Gauge& Registry::AddCallbackGauge(std::string name, std::string help, std::function<double()> fn) {
  return AddGauge(std::move(name), std::move(help)).SetCallback({}, std::move(fn));
}

bool Registry::Has(std::string_view name) const {
  std::lock_guard lock(mu_);
  return std::any_of(families_.begin(), families_.end(), [&](const auto& f) { return f->name() == name; });
}

std::string Registry::Expose() const {
  std::string out;
  std::lock_guard lock(mu_);
  for (const auto& family : families_) family->Render(out);
  return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Process metrics.

namespace {

std::string ReadSmallFile(const char* path) {
  std::ifstream in(path);
  if (!in.good()) return {};
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

double ResidentMemoryBytes() {
  std::istringstream statm(ReadSmallFile("/proc/self/statm"));
  uint64_t size_pages = 0;
  uint64_t resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return std::numeric_limits<double>::quiet_NaN();
  return static_cast<double>(resident_pages) * static_cast<double>(sysconf(_SC_PAGESIZE));
}

double OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return std::numeric_limits<double>::quiet_NaN();
  int64_t n = 0;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++n;  // skips "." and ".."; counts the descriptor of this listing, as Prometheus
  }
  closedir(dir);
  return static_cast<double>(n);
}

// Seconds since the epoch: boot time (btime in /proc/stat) + starttime (field 22 of /proc/self/stat, in clock ticks).
StatusOr<double> ProcessStartTime() {
  const std::string stat = ReadSmallFile("/proc/self/stat");
  const size_t paren = stat.rfind(')');  // the command name (field 2) may hold spaces and parentheses
  if (paren == std::string::npos) return FailedPreconditionError("cannot parse /proc/self/stat");
  std::istringstream fields(stat.substr(paren + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return FailedPreconditionError("cannot parse /proc/self/stat");
  }
  const double start_ticks = std::strtod(field.c_str(), nullptr);

  std::istringstream proc_stat(ReadSmallFile("/proc/stat"));
  std::string line;
  while (std::getline(proc_stat, line)) {
    if (line.starts_with("btime ")) {
      const double boot = std::strtod(line.c_str() + 6, nullptr);
      return boot + start_ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
    }
  }
  return FailedPreconditionError("no btime in /proc/stat");
}

}  // namespace

Status RegisterProcessMetrics(Registry& registry) {
  FATHOM_ASSIGN_OR_RETURN(const double start_time, ProcessStartTime());
  if (std::isnan(ResidentMemoryBytes()) || std::isnan(OpenFds())) {
    return FailedPreconditionError("cannot read /proc/self/statm or /proc/self/fd");
  }
  registry.AddCallbackGauge("process_resident_memory_bytes", "Resident memory size in bytes.", ResidentMemoryBytes);
  registry.AddCallbackGauge("process_open_fds", "Number of open file descriptors.", OpenFds);
  registry.AddGauge("process_start_time_seconds", "Start time of the process since unix epoch in seconds.")
      .Get()
      .Set(start_time);
  return OkStatus();
}

// ---------------------------------------------------------------------------------------------------------------
// GPU metrics through NVML. The few declarations needed are repeated here so that nothing depends on nvml.h or
// links against the driver: the same binary runs on machines without a GPU.

namespace {

using NvmlReturn = int;  // nvmlReturn_t; NVML_SUCCESS is 0
using NvmlDevice = struct NvmlDeviceOpaque*;
struct NvmlUtilization {  // nvmlUtilization_t
  unsigned int gpu;       // percent of time a kernel ran over the last sample period
  unsigned int memory;
};
struct NvmlMemory {  // nvmlMemory_t (v1)
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};

class Nvml {
 public:
  static std::shared_ptr<Nvml> Load(const char* library, Status* status) {
    void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      *status = UnavailableError(fmt::format("NVML not available: {}", dlerror()));
      return nullptr;
    }
    auto nvml = std::shared_ptr<Nvml>(new Nvml(handle));
    if (!nvml->Resolve()) {
      *status = UnavailableError(fmt::format("NVML in {} lacks a needed symbol", library));
      return nullptr;
    }
    if (const NvmlReturn r = nvml->init_(); r != 0) {
      *status = UnavailableError(fmt::format("nvmlInit_v2 failed with code {}", r));
      return nullptr;
    }
    nvml->initialized_ = true;
    return nvml;
  }

  ~Nvml() {
    if (initialized_) shutdown_();
    dlclose(handle_);
  }

  int DeviceCount() const {
    unsigned int n = 0;
    return get_count_(&n) == 0 ? static_cast<int>(n) : -1;
  }
  NvmlDevice Device(int index) const {
    NvmlDevice device = nullptr;
    return get_handle_(static_cast<unsigned int>(index), &device) == 0 ? device : nullptr;
  }
  double UtilizationRatio(NvmlDevice device) const {
    NvmlUtilization u{};
    if (get_utilization_(device, &u) != 0) return std::numeric_limits<double>::quiet_NaN();
    return static_cast<double>(u.gpu) / 100.0;
  }
  double MemoryUsed(NvmlDevice device) const {
    NvmlMemory m{};
    return get_memory_(device, &m) == 0 ? static_cast<double>(m.used) : std::numeric_limits<double>::quiet_NaN();
  }
  double MemoryTotal(NvmlDevice device) const {
    NvmlMemory m{};
    return get_memory_(device, &m) == 0 ? static_cast<double>(m.total) : std::numeric_limits<double>::quiet_NaN();
  }

 private:
  explicit Nvml(void* handle) : handle_(handle) {}

  template <typename F>
  bool Sym(const char* name, F*& fn) {
    fn = reinterpret_cast<F*>(dlsym(handle_, name));
    return fn != nullptr;
  }
  bool Resolve() {
    return Sym("nvmlInit_v2", init_) && Sym("nvmlShutdown", shutdown_) && Sym("nvmlDeviceGetCount_v2", get_count_) &&
           Sym("nvmlDeviceGetHandleByIndex_v2", get_handle_) &&
           Sym("nvmlDeviceGetUtilizationRates", get_utilization_) && Sym("nvmlDeviceGetMemoryInfo", get_memory_);
  }

  void* handle_;
  bool initialized_ = false;
  NvmlReturn (*init_)() = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  NvmlReturn (*get_count_)(unsigned int*) = nullptr;
  NvmlReturn (*get_handle_)(unsigned int, NvmlDevice*) = nullptr;
  NvmlReturn (*get_utilization_)(NvmlDevice, NvmlUtilization*) = nullptr;
  NvmlReturn (*get_memory_)(NvmlDevice, NvmlMemory*) = nullptr;
};

}  // namespace

StatusOr<int> RegisterGpuMetrics(Registry& registry, const char* library) {
  Status status;
  std::shared_ptr<Nvml> nvml = Nvml::Load(library, &status);
  if (nvml == nullptr) return status;
  const int count = nvml->DeviceCount();
  if (count <= 0) return UnavailableError("NVML reports no GPU");
  std::vector<NvmlDevice> devices;
  for (int i = 0; i < count; ++i) {
    NvmlDevice d = nvml->Device(i);
    if (d == nullptr) return UnavailableError(fmt::format("nvmlDeviceGetHandleByIndex_v2({}) failed", i));
    devices.push_back(d);
  }

  // The callbacks hold the library: it stays loaded and initialised as long as the registry.
  auto& util = registry.AddGauge("fathom_gpu_utilization_ratio",
                                 "Share of the last sample period in which a kernel ran on the GPU (NVML).", {"gpu"});
  auto& used = registry.AddGauge("fathom_gpu_memory_used_bytes", "GPU memory in use, all processes (NVML).", {"gpu"});
  auto& total = registry.AddGauge("fathom_gpu_memory_total_bytes", "GPU memory installed (NVML).", {"gpu"});
  for (int i = 0; i < count; ++i) {
    const LabelValues gpu = {std::to_string(i)};
    NvmlDevice d = devices[static_cast<size_t>(i)];
    util.SetCallback(gpu, [nvml, d] { return nvml->UtilizationRatio(d); });
    used.SetCallback(gpu, [nvml, d] { return nvml->MemoryUsed(d); });
    total.SetCallback(gpu, [nvml, d] { return nvml->MemoryTotal(d); });
  }
  return count;
}

}  // namespace fathom::obs
