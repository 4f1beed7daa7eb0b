// dim3 and the small vector types of HIP, as plain structs.
#pragma once

struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
};

#define HIPCPU_VEC2(T, N)                                                   \
  struct alignas(2 * sizeof(T)) N##2 { T x, y; };                           \
  inline N##2 make_##N##2(T a, T b) { return N##2{a, b}; }
#define HIPCPU_VEC4(T, N)                                                   \
  struct alignas(4 * sizeof(T)) N##4 { T x, y, z, w; };                     \
  inline N##4 make_##N##4(T a, T b, T c, T d) { return N##4{a, b, c, d}; }

HIPCPU_VEC2(float, float)
HIPCPU_VEC4(float, float)
HIPCPU_VEC2(int, int)
HIPCPU_VEC4(int, int)
HIPCPU_VEC2(unsigned, uint)
HIPCPU_VEC4(unsigned, uint)
HIPCPU_VEC2(unsigned short, ushort)
HIPCPU_VEC4(unsigned short, ushort)
HIPCPU_VEC2(unsigned char, uchar)
HIPCPU_VEC4(unsigned char, uchar)
HIPCPU_VEC2(char, char)
HIPCPU_VEC4(char, char)
HIPCPU_VEC2(double, double)
HIPCPU_VEC2(long long, longlong)
HIPCPU_VEC2(unsigned long long, ulonglong)
#undef HIPCPU_VEC2
#undef HIPCPU_VEC4
