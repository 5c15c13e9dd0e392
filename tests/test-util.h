// Helpers shared by the tests: where the test data lives, temp files, running the tandem binary.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace td::test {

// ../shared (or $TANDEM_SHARED_DIR): models/, reference/, vocab/.
inline std::string shared_dir() {
    if (const char *env = std::getenv("TANDEM_SHARED_DIR")) return env;
    return TD_SHARED_DIR;
}
inline std::string shared_path(const std::string &rel) { return shared_dir() + "/" + rel; }
inline bool shared_exists(const std::string &rel) { return std::filesystem::exists(shared_path(rel)); }

// A fresh empty directory under the system temp dir, removed by the destructor.
class TempDir {
public:
    TempDir() {
        std::string tmpl = (std::filesystem::temp_directory_path() / "tandem-test-XXXXXX").string();
        char *p = mkdtemp(tmpl.data());
        path_ = p ? p : tmpl;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    const std::string &path() const { return path_; }
    std::string file(const std::string &name) const { return path_ + "/" + name; }

private:
    std::string path_;
};

inline std::string tandem_bin() { return TD_TANDEM_BIN; }

}  // namespace td::test
