// A minimal test harness for the C API: TE_TEST registers a function, TE_EXPECT records a
// failure with its message, main() runs everything (or the tests whose names contain argv[1]).
#pragma once

#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace te_test {

struct Case {
  const char* name;
  std::function<void()> body;
};

inline std::vector<Case>& registry() {
  static std::vector<Case> cases;
  return cases;
}

inline int& failures() {
  static int count = 0;
  return count;
}

struct Register {
  Register(const char* name, std::function<void()> body) { registry().push_back({name, body}); }
};

}  // namespace te_test

#define TE_TEST(name)                                                      \
  static void name();                                                      \
  static ::te_test::Register register_##name(#name, name);                 \
  static void name()

#define TE_EXPECT(cond, ...)                                                \
  do {                                                                      \
    if (!(cond)) {                                                          \
      ++::te_test::failures();                                              \
      std::printf("  FAILED %s:%d: %s: ", __FILE__, __LINE__, #cond);       \
      std::printf(__VA_ARGS__);                                             \
      std::printf("\n");                                                    \
    }                                                                       \
  } while (0)
