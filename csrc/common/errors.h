// Exceptions thrown by argument checks; module.cpp maps them to the Python exception of the
// same name. Messages name the argument, what was expected and what came.
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace llmk {

struct ValueError : std::runtime_error { using std::runtime_error::runtime_error; };
struct TypeError : std::runtime_error { using std::runtime_error::runtime_error; };
struct RuntimeError : std::runtime_error { using std::runtime_error::runtime_error; };
struct NotImplementedError : std::runtime_error { using std::runtime_error::runtime_error; };
// An index or length past what a table holds (block_table entries, cache capacity): Python's
// llmkern.IndexOutOfRangeError, a ValueError that is also a RuntimeError (flash-attn raises
// RuntimeError for these, llmkern always raised ValueError; both keep working).
struct IndexOutOfRangeError : ValueError { using ValueError::ValueError; };

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

}  // namespace llmk

#define LLMK_CHECK(cond, Err, ...)                          \
  do {                                                      \
    if (!(cond)) throw ::llmk::Err(::llmk::str_cat(__VA_ARGS__)); \
  } while (0)
