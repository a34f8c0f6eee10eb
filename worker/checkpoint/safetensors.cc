#include "worker/checkpoint/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>

namespace ferry::worker {
namespace {

using nlohmann::json;

uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Conversions below this size are not worth an OpenMP fork.
constexpr size_t kMinParallelConvert = 1 << 16;

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

size_t DtypeSize(const std::string& dtype) {
  if (dtype == "F32") return 4;
  if (dtype == "BF16" || dtype == "F16") return 2;
  if (dtype == "I8") return 1;  // int8-quantized weights (compressed-tensors.h)
  throw std::runtime_error("unsupported safetensors dtype " + dtype);
}

std::string SafetensorsDtypeFromTorch(const std::string& torch_dtype) {
  if (torch_dtype == "float32") return "F32";
  if (torch_dtype == "bfloat16") return "BF16";
  if (torch_dtype == "float16") return "F16";
  throw std::runtime_error("unsupported dtype " + torch_dtype +
                           " (want float32, bfloat16 or float16)");
}

float Bf16ToFloat(uint16_t bits) { return BitsFloat(uint32_t{bits} << 16); }

uint16_t FloatToBf16(float value) {
  const uint32_t x = FloatBits(value);
  if (std::isnan(value)) return static_cast<uint16_t>((x >> 16) | 0x40);  // stay a quiet NaN
  return static_cast<uint16_t>((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}

float F16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in fp32
    const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;
    return sign ? -v : v;
  }
  if (exp == 31) return BitsFloat(sign | 0x7f800000u | (mant << 13));
  return BitsFloat(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t FloatToF16(float value) {
  uint32_t x = FloatBits(value);
  const uint32_t sign = (x >> 16) & 0x8000;
  x &= 0x7fffffff;
  if (x >= 0x7f800000) {  // inf stays inf, NaN stays a quiet NaN
    return static_cast<uint16_t>(sign | 0x7c00 | (x > 0x7f800000 ? 0x200 : 0));
  }
  if (x >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // >= 65520 rounds to inf
  if (x < 0x38800000) {  // below the smallest normal half: count units of 2^-24
    const float units = std::nearbyint(BitsFloat(x) * 16777216.f);  // ties to even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(units));
  }
  // Rebias the exponent (127 -> 15) and round the 13 dropped bits to nearest even.
  x += 0xc8000fffu + ((x >> 13) & 1);
  return static_cast<uint16_t>(sign | (x >> 13));
}

void ConvertToFloat(const std::string& dtype, const void* src, size_t count, float* dst) {
  const int64_t n = static_cast<int64_t>(count);
  if (dtype == "F32") {
    std::memcpy(dst, src, count * 4);
  } else if (dtype == "BF16") {
    const auto* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for schedule(static) if (count >= kMinParallelConvert)
    for (int64_t i = 0; i < n; ++i) dst[i] = Bf16ToFloat(s[i]);
  } else if (dtype == "F16") {
    const auto* s = static_cast<const uint16_t*>(src);
#pragma omp parallel for schedule(static) if (count >= kMinParallelConvert)
    for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(s[i]);
  } else if (dtype == "I8") {
    const auto* s = static_cast<const int8_t*>(src);  // exact: every int8 is a float
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
  } else {
    throw std::runtime_error("unsupported safetensors dtype " + dtype);
  }
}

void ConvertFromFloat(const std::string& dtype, const float* src, size_t count, void* dst) {
  const int64_t n = static_cast<int64_t>(count);
  if (dtype == "F32") {
    std::memcpy(dst, src, count * 4);
  } else if (dtype == "BF16") {
    auto* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for schedule(static) if (count >= kMinParallelConvert)
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToBf16(src[i]);
  } else if (dtype == "F16") {
    auto* d = static_cast<uint16_t*>(dst);
#pragma omp parallel for schedule(static) if (count >= kMinParallelConvert)
    for (int64_t i = 0; i < n; ++i) d[i] = FloatToF16(src[i]);
  } else {
    throw std::runtime_error("unsupported safetensors dtype " + dtype);
  }
}

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorInfo::num_elements() const { return NumElements(shape); }

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

// A whole number in [0, 2^63): nlohmann's get<int64_t> would convert a float (4.3e21 is undefined
// as an int64) or wrap a negative into a uint64 without a word.
int64_t WholeNumber(const json& v, const std::string& field) {
  const bool fits = v.is_number_unsigned() ? v.get<uint64_t>() <= static_cast<uint64_t>(INT64_MAX)
                                           : v.is_number_integer() && v.get<int64_t>() >= 0;
  if (!fits) throw std::runtime_error(field + " = " + v.dump() + " is not a whole number from 0 to 2^63 - 1");
  return v.get<int64_t>();
}

TensorInfo ParseTensorInfo(const std::string& path, const std::string& name, const json& j,
                           uint64_t data_size) {
  TensorInfo info;
  try {
    info.dtype = j.at("dtype").get<std::string>();
    const json& shape = j.at("shape");
    if (!shape.is_array()) throw std::runtime_error("shape = " + shape.dump() + " is not an array");
    for (size_t i = 0; i < shape.size(); ++i) {
      info.shape.push_back(WholeNumber(shape[i], "shape[" + std::to_string(i) + "]"));
    }
    const json& offsets = j.at("data_offsets");
    if (!offsets.is_array() || offsets.size() != 2) throw std::runtime_error("data_offsets must have 2 entries");
    info.begin = static_cast<uint64_t>(WholeNumber(offsets[0], "data_offsets[0]"));
    info.end = static_cast<uint64_t>(WholeNumber(offsets[1], "data_offsets[1]"));
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path + ": bad header entry for tensor " + name + ": " + e.what());
  } catch (const json::exception& e) {
    throw std::runtime_error(path + ": bad header entry for tensor " + name + ": " + e.what());
  }
  if (info.begin > info.end || info.end > data_size) {
    throw std::runtime_error(path + ": tensor " + name + " lies outside the file");
  }
  // The element count must be a product that fits: a hostile shape would otherwise overflow it
  // (undefined) or go negative, and readers size their buffers from it.
  int64_t count = 1;
  for (size_t i = 0; i < info.shape.size(); ++i) {
    const int64_t d = info.shape[i];
    if (d < 0 || (d != 0 && count > kMaxTensorElements / d)) {
      throw std::runtime_error(path + ": tensor " + name + ": shape[" + std::to_string(i) + "] = " +
                               std::to_string(d) + " makes " + ShapeString(info.shape) +
                               " negative or more than " + std::to_string(kMaxTensorElements) +
                               " elements");
    }
    count *= d;
  }
  if (info.dtype == "F32" || info.dtype == "BF16" || info.dtype == "F16" || info.dtype == "I8") {
    const uint64_t want = static_cast<uint64_t>(info.num_elements()) * DtypeSize(info.dtype);
    if (info.end - info.begin != want) {
      throw std::runtime_error(path + ": tensor " + name + " has " +
                               std::to_string(info.end - info.begin) + " bytes, shape " +
                               ShapeString(info.shape) + " needs " + std::to_string(want));
    }
  }
  return info;
}

}  // namespace

std::map<std::string, TensorInfo> ParseSafetensorsHeader(const uint8_t* bytes, size_t size,
                                                         const std::string& source,
                                                         uint64_t* data_offset) {
  if (size < 8) throw std::runtime_error(source + ": not a safetensors file (too short)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | bytes[i];  // little-endian
  if (header_len > size - 8) {
    throw std::runtime_error(source + ": header length " + std::to_string(header_len) +
                             " exceeds the file");
  }
  const uint64_t data_size = size - 8 - header_len;
  json header;
  try {
    header = json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const json::exception& e) {
    throw std::runtime_error(source + ": bad header JSON: " + e.what());
  }
  if (!header.is_object()) throw std::runtime_error(source + ": header is not a JSON object");
  std::map<std::string, TensorInfo> tensors;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    tensors[name] = ParseTensorInfo(source, name, entry, data_size);
  }
  *data_offset = 8 + header_len;
  return tensors;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size < 8) {
    ::close(fd);
    throw std::runtime_error(path + ": not a safetensors file (too short)");
  }
  map_size_ = static_cast<size_t>(st.st_size);
  map_ = ::mmap(nullptr, map_size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw std::runtime_error(path + ": mmap failed: " + std::strerror(errno));
  }
  const auto* bytes = static_cast<const uint8_t*>(map_);
  uint64_t data_offset = 0;
  try {
    tensors_ = ParseSafetensorsHeader(bytes, map_size_, path, &data_offset);
  } catch (...) {
    ::munmap(map_, map_size_);
    map_ = nullptr;
    throw;
  }
  data_ = bytes + data_offset;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const TensorInfo& SafetensorsFile::Info(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw std::runtime_error(path_ + ": missing tensor " + name);
  return it->second;
}

void SafetensorsFile::ReadFloat32(const std::string& name, float* dst) const {
  const TensorInfo& info = Info(name);
  try {
    ConvertToFloat(info.dtype, data_ + info.begin, static_cast<size_t>(info.num_elements()), dst);
  } catch (const std::runtime_error& e) {
    throw std::runtime_error(path_ + ": tensor " + name + ": " + e.what());
  }
}

void SafetensorsFile::ReadFloat32Block(const std::string& name, int64_t row_begin,
                                       int64_t row_end, int64_t col_begin, int64_t col_end,
                                       float* dst) const {
  const TensorInfo& info = Info(name);
  const int64_t rows = info.shape.empty() ? 1 : info.shape[0];
  const int64_t cols = rows == 0 ? 0 : info.num_elements() / rows;
  if (row_begin < 0 || row_end > rows || row_begin > row_end || col_begin < 0 ||
      col_end > cols || col_begin > col_end) {
    throw std::runtime_error(path_ + ": tensor " + name + ": block [" +
                             std::to_string(row_begin) + ", " + std::to_string(row_end) + ") x [" +
                             std::to_string(col_begin) + ", " + std::to_string(col_end) +
                             ") outside " + ShapeString(info.shape));
  }
  const size_t element = DtypeSize(info.dtype);
  const int64_t width = col_end - col_begin;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* src = data_ + info.begin + (r * cols + col_begin) * element;
    ConvertToFloat(info.dtype, src, static_cast<size_t>(width), dst + (r - row_begin) * width);
  }
}

Checkpoint::Checkpoint(const std::string& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  if (fs::exists(index_path)) {
    std::ifstream in(index_path);
    json index;
    std::map<std::string, std::string> weight_map;
    try {
      index = json::parse(in);
      weight_map = index.at("weight_map").get<std::map<std::string, std::string>>();
    } catch (const json::exception& e) {
      throw std::runtime_error(index_path.string() + ": bad index: " + e.what());
    }
    std::map<std::string, const SafetensorsFile*> by_file;
    for (const auto& [tensor, file] : weight_map) {
      if (!by_file.count(file)) {
        files_.push_back(std::make_unique<SafetensorsFile>((fs::path(dir) / file).string()));
        by_file[file] = files_.back().get();
      }
      if (!by_file[file]->Has(tensor)) {
        throw std::runtime_error(by_file[file]->path() + ": missing tensor " + tensor +
                                 " (listed in " + index_path.string() + ")");
      }
      owner_[tensor] = by_file[file];
    }
  } else if (fs::exists(single_path)) {
    files_.push_back(std::make_unique<SafetensorsFile>(single_path.string()));
    for (const auto& [name, info] : files_.back()->tensors()) owner_[name] = files_.back().get();
  } else {
    throw std::runtime_error(dir + ": no model.safetensors or model.safetensors.index.json");
  }
}

const SafetensorsFile& Checkpoint::FileOf(const std::string& name, const std::vector<int64_t>& shape) const {
  const auto it = owner_.find(name);
  if (it == owner_.end()) {
    const std::string where = files_.size() == 1 ? files_[0]->path() : dir_ + " (sharded)";
    throw std::runtime_error(where + ": missing tensor " + name);
  }
  const TensorInfo& info = it->second->Info(name);
  if (info.shape != shape) {
    throw std::runtime_error(it->second->path() + ": tensor " + name + " has shape " +
                             ShapeString(info.shape) + ", expected " + ShapeString(shape));
  }
  return *it->second;
}

std::vector<std::string> Checkpoint::Names() const {
  std::vector<std::string> names;
  names.reserve(owner_.size());
  for (const auto& [name, file] : owner_) names.push_back(name);
  return names;
}

const std::string& Checkpoint::Dtype(const std::string& name) const {
  const auto it = owner_.find(name);
  if (it == owner_.end()) {
    throw std::runtime_error((files_.size() == 1 ? files_[0]->path() : dir_ + " (sharded)") + ": missing tensor " + name);
  }
  return it->second->Info(name).dtype;
}

// An int8 tensor read as floats where float weights are expected (or the reverse) would load a
// model that runs and computes nonsense: refused, naming the tensor.
static void CheckKind(const SafetensorsFile& file, const std::string& name, bool int8) {
  const std::string& dtype = file.Info(name).dtype;
  if ((dtype == "I8") != int8) {
    throw std::runtime_error(file.path() + ": tensor " + name + " is " + dtype + ", expected " +
                             (int8 ? "I8 (an int8-quantized layer of quantization_config)"
                                   : "a float dtype (F32, BF16 or F16)"));
  }
}

void Checkpoint::Read(const std::string& name, const std::vector<int64_t>& shape,
                      float* dst) const {
  const SafetensorsFile& file = FileOf(name, shape);
  CheckKind(file, name, false);
  file.ReadFloat32(name, dst);
}

void Checkpoint::ReadBlock(const std::string& name, const std::vector<int64_t>& shape,
                           int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end,
                           float* dst, bool int8) const {
  const SafetensorsFile& file = FileOf(name, shape);
  CheckKind(file, name, int8);
  file.ReadFloat32Block(name, row_begin, row_end, col_begin, col_end, dst);
}

std::vector<float> Checkpoint::Read(const std::string& name,
                                    const std::vector<int64_t>& shape) const {
  std::vector<float> out(static_cast<size_t>(NumElements(shape)));
  Read(name, shape, out.data());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writing

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<Entry> entries,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), entries_(std::move(entries)) {
  json header = json::object();
  header["__metadata__"] = metadata;
  uint64_t offset = 0;
  std::set<std::string> names;
  for (const Entry& e : entries_) {
    if (!names.insert(e.name).second) throw std::runtime_error(path + ": duplicate " + e.name);
    const uint64_t bytes = static_cast<uint64_t>(NumElements(e.shape)) * DtypeSize(e.dtype);
    header[e.name] = {{"dtype", e.dtype},
                      {"shape", e.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned, as the reference writer does.
  text.append((8 - text.size() % 8) % 8, ' ');
  file_ = std::fopen(path.c_str(), "wb");
  if (file_ == nullptr) {
    throw std::runtime_error(path + ": cannot create: " + std::strerror(errno));
  }
  uint8_t len_bytes[8];
  for (int i = 0; i < 8; ++i) len_bytes[i] = static_cast<uint8_t>(uint64_t{text.size()} >> (8 * i));
  if (std::fwrite(len_bytes, 1, 8, file_) != 8 ||
      std::fwrite(text.data(), 1, text.size(), file_) != text.size()) {
    throw std::runtime_error(path + ": write failed");
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (file_ != nullptr) std::fclose(file_);
}

void SafetensorsWriter::SkipEmpty() {
  while (current_ < entries_.size() && NumElements(entries_[current_].shape) == 0) ++current_;
}

void SafetensorsWriter::Write(const float* values, size_t count) {
  while (count > 0) {
    SkipEmpty();
    if (current_ >= entries_.size()) throw std::runtime_error(path_ + ": more data than tensors");
    const Entry& e = entries_[current_];
    const int64_t n = NumElements(e.shape);
    const size_t take = std::min<size_t>(count, static_cast<size_t>(n - written_in_current_));
    scratch_.resize(take * DtypeSize(e.dtype));
    ConvertFromFloat(e.dtype, values, take, scratch_.data());
    if (std::fwrite(scratch_.data(), 1, scratch_.size(), file_) != scratch_.size()) {
      throw std::runtime_error(path_ + ": write failed for tensor " + e.name);
    }
    values += take;
    count -= take;
    written_in_current_ += static_cast<int64_t>(take);
    if (written_in_current_ == n) {
      ++current_;
      written_in_current_ = 0;
    }
  }
}

void SafetensorsWriter::Finish() {
  if (written_in_current_ == 0) SkipEmpty();
  if (current_ != entries_.size()) {
    throw std::runtime_error(path_ + ": tensor " + entries_[current_].name + " not fully written");
  }
  const bool ok = std::fclose(file_) == 0;
  file_ = nullptr;
  if (!ok) throw std::runtime_error(path_ + ": close failed");
}

void WriteSafetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors) {
  std::vector<SafetensorsWriter::Entry> entries;
  for (const auto& [name, t] : tensors) {
    if (static_cast<int64_t>(t.values.size()) != NumElements(t.shape)) {
      throw std::runtime_error(path + ": tensor " + name + " has " +
                               std::to_string(t.values.size()) + " values for shape " +
                               ShapeString(t.shape));
    }
    entries.push_back({name, t.dtype, t.shape});
  }
  SafetensorsWriter writer(path, std::move(entries));
  for (const auto& [name, t] : tensors) writer.Write(t.values.data(), t.values.size());
  writer.Finish();
}

}  // namespace ferry::worker
