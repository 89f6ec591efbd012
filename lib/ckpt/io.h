// Byte-level file primitives of lib/ckpt's checkpoint code (internal to lib/ckpt): CRC-32,
// whole writes, fsync and small atomic writes, whole-file reads. They know nothing of manifests
// or pieces; errors name the path and the system's reason.
//
// Invariant: write_file_atomic's file is either the old one or the whole new one, durably (temp
// file, fsync, rename, fsync of the folder), so a reader never sees a torn file.
#pragma once

#include <cstdint>
#include <string>

namespace ft::ckpt {

std::string errno_text();  // strerror(errno)
// CRC-32 (zlib's) of n bytes, continuing from crc; n may exceed zlib's 32-bit lengths.
uint32_t crc_of(const void* p, uint64_t n, uint32_t crc = 0);
// Writes all n bytes to fd (retrying short writes and EINTR); throws Error naming path.
void write_all(int fd, const void* p, uint64_t n, const std::string& path);
// fsync of a file or a folder; a folder whose file system cannot sync it is let through.
void fsync_path(const std::string& path, bool directory);
// Writes a small file durably and atomically: temp file, fsync, rename, fsync of the folder.
void write_file_atomic(const std::string& path, const std::string& text);
std::string read_text(const std::string& path);  // the whole file; throws Error if unreadable

}  // namespace ft::ckpt
