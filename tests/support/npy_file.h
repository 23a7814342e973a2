// A version 1.0 .npy file as numpy's np.save writes it, for tests that
// feed arrays to the data readers.
#ifndef GPIPE_TESTS_SUPPORT_NPY_FILE_H_
#define GPIPE_TESTS_SUPPORT_NPY_FILE_H_

#include <string>

namespace gpipe::test_support {

// `descr` such as "<f4" or "<i8", `shape` such as "(2, 3)", `data` the
// array's bytes in C order.
inline std::string NpyFile(const std::string& descr, const std::string& shape,
                           const std::string& data) {
  std::string dict = "{'descr': '" + descr +
                     "', 'fortran_order': False, 'shape': " + shape + ", }";
  // The header, padded with spaces, ends with a newline on a multiple of 64.
  while ((10 + dict.size() + 1) % 64 != 0) dict += ' ';
  dict += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(dict.size() & 0xff);
  out += static_cast<char>(dict.size() >> 8);
  return out + dict + data;
}

}  // namespace gpipe::test_support

#endif  // GPIPE_TESTS_SUPPORT_NPY_FILE_H_
