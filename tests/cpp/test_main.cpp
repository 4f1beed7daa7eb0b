#include <cstring>

#include "test_harness.h"

int main(int argc, char** argv) {
  const char* filter = argc > 1 ? argv[1] : "";
  int run = 0, failed_tests = 0;
  for (const auto& c : te_test::registry()) {
    if (std::strstr(c.name, filter) == nullptr) continue;
    const int before = te_test::failures();
    c.body();
    ++run;
    const bool ok = te_test::failures() == before;
    failed_tests += ok ? 0 : 1;
    std::printf("%s %s\n", ok ? "[  OK  ]" : "[ FAIL ]", c.name);
  }
  std::printf("%d tests, %d passed, %d failed\n", run, run - failed_tests, failed_tests);
  return failed_tests == 0 && run > 0 ? 0 : 1;
}
