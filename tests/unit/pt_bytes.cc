#include "pt_bytes.h"

extern "C" {
#include "core/crc32.h"
}

namespace ckptio_test {
namespace {

void le(std::string &b, uint64_t v, int n) {
  for (int k = 0; k < n; k++) b += (char)(uint8_t)(v >> (8 * k));
}

struct Pickle {
  std::string b;
  Pickle &op(uint8_t c) { return b += (char)c, *this; }
  Pickle &global(const std::string &m, const std::string &n) { return op('c'), b += m + "\n" + n + "\n", *this; }
  Pickle &str(const std::string &s) { return op('X'), le(b, s.size(), 4), b += s, *this; }
  Pickle &i(int64_t v) { return op(0x8a).op(8), le(b, (uint64_t)v, 8), *this; }  // LONG1, always 8 bytes
  Pickle &ints(const std::vector<int64_t> &v) {
    op('(');
    for (int64_t x : v) i(x);
    return op('t');
  }
  Pickle &odict() { return global("collections", "OrderedDict").op(')').op('R'); }
};

struct Entry {
  std::string name, data;
};

std::string zip(const std::vector<Entry> &es) {
  std::string b;
  std::vector<uint64_t> at;
  std::vector<uint32_t> crcs;
  for (const Entry &e : es) {
    uint32_t crc = ckptio_crc32(0, e.data.data(), e.data.size());
    crcs.push_back(crc);
    at.push_back(b.size());
    size_t start = b.size() + 30 + e.name.size() + 4, pad = (64 - start % 64) % 64;
    le(b, 0x04034b50, 4), le(b, 0, 2), le(b, e.data.empty() ? 0x0800 : 0x0808, 2), le(b, 0, 2);
    le(b, 0, 4), le(b, 0, 4), le(b, 0, 8), le(b, e.name.size(), 2), le(b, 4 + pad, 2);
    b += e.name + "FB";
    le(b, pad, 2);
    b += std::string(pad, 'Z') + e.data;
    if (!e.data.empty()) le(b, 0x08074b50, 4), le(b, crc, 4), le(b, e.data.size(), 4), le(b, e.data.size(), 4);
  }
  uint64_t cd = b.size();
  for (size_t k = 0; k < es.size(); k++) {
    const Entry &e = es[k];
    le(b, 0x02014b50, 4), le(b, 0, 4), le(b, e.data.empty() ? 0x0800 : 0x0808, 2), le(b, 0, 2);
    le(b, 0, 4), le(b, crcs[k], 4), le(b, e.data.size(), 4), le(b, e.data.size(), 4);
    le(b, e.name.size(), 2), le(b, 0, 2), le(b, 0, 2), le(b, 0, 2), le(b, 0, 2), le(b, 0, 4), le(b, at[k], 4);
    b += e.name;
  }
  uint64_t cd_size = b.size() - cd;
  le(b, 0x06054b50, 4), le(b, 0, 4), le(b, es.size(), 2), le(b, es.size(), 2);
  le(b, cd_size, 4), le(b, cd, 4), le(b, 0, 2);
  return b;
}

}  // namespace

std::string pt_archive(const std::vector<PtTensor> &ts,
                       const std::vector<std::pair<std::string, std::string>> &storages,
                       const std::string &byteorder) {
  Pickle p;
  p.op(0x80).op(2).odict().op('(');
  for (const PtTensor &t : ts) {
    p.str(t.name).global("torch._utils", "_rebuild_tensor_v2").op('(');
    p.op('(').str("storage").global("torch", t.storage_class).str(t.key).str("cpu").i(t.storage_numel).op('t');
    p.op('Q').i(t.offset).ints(t.size).ints(t.stride).op(0x89).odict().op('t').op('R');
  }
  p.op('u').op('.');
  std::vector<Entry> es = {{"archive/data.pkl", p.b}, {"archive/.format_version", "1"},
                           {"archive/.storage_alignment", "64"}, {"archive/byteorder", byteorder}};
  for (auto &s : storages) es.push_back({"archive/data/" + s.first, s.second});
  es.push_back({"archive/version", "3\n"});
  es.push_back({"archive/.data/serialization_id", std::string(40, '1')});
  return zip(es);
}

}  // namespace ckptio_test
