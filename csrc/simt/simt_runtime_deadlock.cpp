// The SIMT scheduler's deadlock report: when no thread of a block can run, which threads wait
// where (the barrier and who did not reach it, each pending warp collective and its missing lanes,
// the conditions threads block on), for the launch's RuntimeError.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "simt/simt_runtime_internal.h"

namespace llmk {
namespace simt {
namespace emu {

using namespace detail;

namespace {

std::string describe_wait(const Fiber* f) {
  if (f->state == kDone) return "exited";
  if (f->state == kAtBarrier) return str_cat("wait at ", bar_name(emu().bar_op), "() ", site(f->file, f->line));
  if (f->state == kInWarpOp)
    return str_cat("wait in ", op_name(f->op), "(mask=", hex(f->mask), ") ", site(f->file, f->line));
  if (f->state == kWaitCond) return str_cat("wait at ", f->wait_what, " ", site(f->file, f->line));
  return "ready";
}

}  // namespace

namespace detail {

std::string describe_deadlock() {
  Emulator& g = emu();
  std::vector<std::string> parts;
  if (g.bar_arrived > 0) {
    std::vector<int> at;
    std::vector<std::pair<std::string, std::vector<int>>> others;
    for (int i = 0; i < g.n; ++i) {
      const Fiber* f = g.pool[i].get();
      if (f->state == kAtBarrier) { at.push_back(i); continue; }
      const std::string w = describe_wait(f);
      auto it = std::find_if(others.begin(), others.end(), [&](const auto& o) { return o.first == w; });
      if (it == others.end()) others.push_back({w, {i}});
      else it->second.push_back(i);
    }
    std::string s = str_cat(bar_name(g.bar_op), "() at ", site(g.bar_file, g.bar_line), " reached by ",
                            at.size(), " of ", g.n, " threads (", ranges(at), ")");
    for (const auto& o : others) s += str_cat("; threads ", ranges(o.second), " ", o.first);
    parts.push_back(s);
  }
  for (int w = 0; w < g.nwarps; ++w) {
    for (int k = 0; k < 32; ++k) {
      const WarpGroup& grp = g.groups[static_cast<size_t>(w) * 32 + k];
      if (!grp.used) continue;
      std::string s = str_cat(op_name(grp.op), "(mask=", hex(grp.mask), ") at ", site(grp.file, grp.line),
                              " in warp ", w, " reached by lanes ", lanes_str(grp.arrived));
      const unsigned missing = grp.mask & ~grp.arrived & ~g.warp_exited[static_cast<size_t>(w)];
      std::vector<std::pair<std::string, unsigned>> why;
      for (int l = 0; l < 32; ++l) {
        if (!(missing >> l & 1u)) continue;
        const std::string d = describe_wait(g.pool[static_cast<size_t>(w) * 32 + l].get());
        auto it = std::find_if(why.begin(), why.end(), [&](const auto& o) { return o.first == d; });
        if (it == why.end()) why.push_back({d, 1u << l});
        else it->second |= 1u << l;
      }
      for (const auto& o : why) s += str_cat("; lanes ", lanes_str(o.second), " ", o.first);
      parts.push_back(s);
    }
  }
  if (g.bar_arrived == 0) {
    std::vector<std::pair<std::string, std::vector<int>>> conds;
    for (int i = 0; i < g.n; ++i) {
      const Fiber* f = g.pool[i].get();
      if (f->state != kWaitCond) continue;
      const std::string w = describe_wait(f);
      auto it = std::find_if(conds.begin(), conds.end(), [&](const auto& o) { return o.first == w; });
      if (it == conds.end()) conds.push_back({w, {i}});
      else it->second.push_back(i);
    }
    for (const auto& o : conds) parts.push_back(str_cat("threads ", ranges(o.second), " ", o.first));
  }
  std::string msg = "deadlock: ";
  for (size_t i = 0; i < parts.size(); ++i) msg += (i ? " | " : "") + parts[i];
  if (parts.empty()) msg += "no thread can make progress";
  return msg + " (a barrier must be reached by every thread of the block, a collective by every lane of its mask)";
}

}  // namespace detail

}  // namespace emu
}  // namespace simt
}  // namespace llmk
