#include "util/error.h"

#include "transformer_engine/transformer_engine.h"

namespace te {
namespace {
thread_local std::string last_error;
}

void set_last_error(const std::string& msg) { last_error = msg; }
void clear_last_error() { last_error.clear(); }

}  // namespace te

extern "C" const char* nvte_last_error_message(void) { return te::last_error.c_str(); }

extern "C" const char* nvte_dtype_name(NVTEDType dtype) {
  switch (dtype) {
    case kNVTEFloat32: return "float32";
    case kNVTEFloat16: return "float16";
    case kNVTEBFloat16: return "bfloat16";
    case kNVTEFloat8E4M3: return "float8_e4m3";
    case kNVTEFloat8E5M2: return "float8_e5m2";
    case kNVTEInt32: return "int32";
    case kNVTEInt64: return "int64";
    case kNVTEByte: return "byte";
    default: return "invalid";
  }
}

extern "C" size_t nvte_dtype_size(NVTEDType dtype) {
  switch (dtype) {
    case kNVTEFloat32: case kNVTEInt32: return 4;
    case kNVTEFloat16: case kNVTEBFloat16: return 2;
    case kNVTEFloat8E4M3: case kNVTEFloat8E5M2: case kNVTEByte: return 1;
    case kNVTEInt64: return 8;
    default: return 0;
  }
}
