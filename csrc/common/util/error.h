// Errors as values: C++ exceptions inside the core, converted to a status + message at the C
// boundary by `te::guard`. Nothing in the core calls abort() or exits.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "transformer_engine/transformer_engine.h"

namespace te {

class Error : public std::runtime_error {
 public:
  Error(NVTEStatus status, const std::string& msg) : std::runtime_error(msg), status_(status) {}
  NVTEStatus status() const { return status_; }

 private:
  NVTEStatus status_;
};

template <typename... Args>
std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

void set_last_error(const std::string& msg);
void clear_last_error();

// Runs `body` for the C entry point `op`, turning exceptions into a status and a message that
// starts with the op's name.
template <typename Body>
NVTEStatus guard(const char* op, Body&& body) {
  try {
    clear_last_error();
    body();
    return kNVTESuccess;
  } catch (const Error& e) {
    set_last_error(concat(op, ": ", e.what()));
    return e.status();
  } catch (const std::exception& e) {
    set_last_error(concat(op, ": internal error: ", e.what()));
    return kNVTEDeviceError;
  }
}

}  // namespace te

#define TE_CHECK_ARG(cond, ...)                                              \
  do {                                                                       \
    if (!(cond)) throw ::te::Error(kNVTEInvalidArgument, ::te::concat(__VA_ARGS__)); \
  } while (0)

#define TE_UNSUPPORTED(...) throw ::te::Error(kNVTEUnsupported, ::te::concat(__VA_ARGS__))
