// The web dashboard's files (src/server/web), compiled into the binary by cmake/embed-files.cmake: `tandem
// serve` answers GET /<name> with them, and / with index.html. No file is read at run time, no CDN is used.
#pragma once

#include <string_view>
#include <vector>

namespace td::server {

struct WebAsset {
    std::string_view path;          // "/app.js"
    std::string_view content_type;  // "text/javascript; charset=utf-8"
    std::string_view body;
};

const std::vector<WebAsset> &web_assets();

}  // namespace td::server
