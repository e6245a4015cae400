// torch.save archives built byte by byte (protocol-2 pickle of an
// OrderedDict of tensors, stored zip with 64-byte aligned records), for tests
// that need what ckptio's own writer never makes: views sharing a storage
// with strides and offsets, and big-endian files. A compact twin of the
// builder inside test_torch_read.cc.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ckptio_test {

struct PtTensor {
  std::string name;
  std::string storage_class;     // "FloatStorage", "HalfStorage", ...
  std::string key;               // storage key: data/<key>
  int64_t storage_numel;
  int64_t offset;                // storage_offset, in elements
  std::vector<int64_t> size, stride;
};

// A .pt file: data.pkl with the tensors, byteorder record, one data/<key>
// record per storage (bytes given), CRCs filled in.
std::string pt_archive(const std::vector<PtTensor> &ts,
                       const std::vector<std::pair<std::string, std::string>> &storages,
                       const std::string &byteorder = "little");

}  // namespace ckptio_test
