// Read-only memory map of a whole file. Weights stay mapped (never copied) for the process lifetime.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "core/status.h"

namespace td {

class MappedFile {
public:
    // Maps `path` read-only. Errors: not_found / io with the path and strerror in the message.
    // An empty file maps to size() == 0 and data() == nullptr.
    static Result<MappedFile> open(const std::string &path);

    MappedFile() = default;
    MappedFile(MappedFile &&other) noexcept;
    MappedFile &operator=(MappedFile &&other) noexcept;
    MappedFile(const MappedFile &) = delete;
    MappedFile &operator=(const MappedFile &) = delete;
    ~MappedFile();

    const uint8_t *data() const { return data_; }
    size_t size() const { return size_; }
    const std::string &path() const { return path_; }

private:
    uint8_t *data_ = nullptr;
    size_t size_ = 0;
    std::string path_;
};

}  // namespace td
