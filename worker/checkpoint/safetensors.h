// safetensors reading (mmap, F32/BF16/F16 -> fp32) and streaming writing, plus checkpoint
// directories that are one file or sharded through model.safetensors.index.json.
//
// Format: 8-byte little-endian header length N, N bytes of JSON
// {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}, then the
// data section; offsets are relative to its start.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ferry::worker {

// Element dtypes as spelled in safetensors headers: "F32", "BF16", "F16".
size_t DtypeSize(const std::string& dtype);  // throws std::runtime_error if unsupported
// "float32" | "bfloat16" | "float16" (config.json torch_dtype spelling) -> "F32" | "BF16" | "F16".
std::string SafetensorsDtypeFromTorch(const std::string& torch_dtype);

float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);  // round to nearest even
float F16ToFloat(uint16_t bits);
uint16_t FloatToF16(float value);   // round to nearest even

// Converts count elements of the given dtype at src to fp32.
void ConvertToFloat(const std::string& dtype, const void* src, size_t count, float* dst);
// Converts count fp32 values to the given dtype at dst.
void ConvertFromFloat(const std::string& dtype, const float* src, size_t count, void* dst);

int64_t NumElements(const std::vector<int64_t>& shape);
// The most elements a tensor of a checkpoint may have (2^48: far past any model, and the byte
// count of every dtype still fits in int64).
inline constexpr int64_t kMaxTensorElements = int64_t{1} << 48;

struct TensorInfo {
  std::string dtype;           // "F32" | "BF16" | "F16" (others listed but unreadable)
  std::vector<int64_t> shape;
  uint64_t begin = 0;          // byte offsets into the data section
  uint64_t end = 0;
  int64_t num_elements() const;
};

// Parses the header of a safetensors file held in `bytes` (`size` bytes: the 8-byte length, the
// JSON, the data section) and checks every tensor's dtype, shape and offsets against it. Sets
// *data_offset to where the data section starts. Throws std::runtime_error naming `source`, the
// tensor and the field. Fuzzed on raw bytes (tests/fuzz/safetensors_header_fuzz.cc).
std::map<std::string, TensorInfo> ParseSafetensorsHeader(const uint8_t* bytes, size_t size,
                                                         const std::string& source,
                                                         uint64_t* data_offset);

// One memory-mapped .safetensors file. Errors name the file (and tensor).
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  bool Has(const std::string& name) const { return tensors_.count(name) != 0; }
  const TensorInfo& Info(const std::string& name) const;
  // Copies the tensor, converted to fp32, into dst (num_elements floats).
  void ReadFloat32(const std::string& name, float* dst) const;
  // Copies rows [row_begin, row_end) x columns [col_begin, col_end) of the tensor viewed as
  // [shape[0], product of the other dims] (a 1-D tensor has one column), as fp32, into dst:
  // [row_end - row_begin, col_end - col_begin]. Ranges must be in bounds.
  void ReadFloat32Block(const std::string& name, int64_t row_begin, int64_t row_end,
                        int64_t col_begin, int64_t col_end, float* dst) const;

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t map_size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, TensorInfo> tensors_;
};

// A checkpoint directory: model.safetensors, or the shards named by
// model.safetensors.index.json ("weight_map": tensor -> file).
class Checkpoint {
 public:
  explicit Checkpoint(const std::string& dir);

  bool Has(const std::string& name) const { return owner_.count(name) != 0; }
  // Every tensor's name, across the shards, sorted.
  std::vector<std::string> Names() const;
  // The safetensors dtype of a tensor ("BF16", "I8", ...); throws when it is missing.
  const std::string& Dtype(const std::string& name) const;
  // Reads a tensor that must have exactly `shape` into dst as fp32. Throws std::runtime_error
  // naming the file and tensor when it is missing or its shape differs.
  void Read(const std::string& name, const std::vector<int64_t>& shape, float* dst) const;
  std::vector<float> Read(const std::string& name, const std::vector<int64_t>& shape) const;
  // A block of a tensor that must have exactly `shape` (see SafetensorsFile::ReadFloat32Block):
  // how a tensor-parallel rank reads only its shard. int8: the tensor must be I8 (its values
  // come back as floats, exactly); otherwise it must be a float dtype (Read too).
  void ReadBlock(const std::string& name, const std::vector<int64_t>& shape, int64_t row_begin,
                 int64_t row_end, int64_t col_begin, int64_t col_end, float* dst, bool int8 = false) const;

 private:
  // The file holding `name`; throws std::runtime_error (naming file and tensor) when the tensor is
  // missing or its shape is not `shape`.
  const SafetensorsFile& FileOf(const std::string& name, const std::vector<int64_t>& shape) const;
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const SafetensorsFile*> owner_;
};

// Writes a .safetensors file tensor by tensor so a large checkpoint never sits in memory
// twice. The header (all names, dtypes and shapes) is fixed at construction; Write calls then
// supply the data in the same order, in as many chunks as the caller likes.
class SafetensorsWriter {
 public:
  struct Entry {
    std::string name;
    std::string dtype;  // "F32" | "BF16" | "F16"
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(const std::string& path, std::vector<Entry> entries,
                    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});
  ~SafetensorsWriter();

  // Appends values to the current tensor, moving to the next one when it is full.
  void Write(const float* values, size_t count);
  // Checks every tensor was written completely and closes the file.
  void Finish();

 private:
  void SkipEmpty();  // moves past zero-element tensors, which take no data

  std::string path_;
  std::vector<Entry> entries_;
  std::FILE* file_ = nullptr;
  size_t current_ = 0;        // index into entries_
  int64_t written_in_current_ = 0;
  std::vector<uint8_t> scratch_;
};

// Convenience for small files (tests): writes every tensor from memory.
struct HostTensor {
  std::string dtype;  // "F32" | "BF16" | "F16"
  std::vector<int64_t> shape;
  std::vector<float> values;
};
void WriteSafetensors(const std::string& path, const std::map<std::string, HostTensor>& tensors);

}  // namespace ferry::worker
