#pragma once
// What the HTTP handlers send: a JSON body with its status, and OpenAI's error objects.
#include <httplib.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "server/openai.h"

namespace specula {

void send_json(httplib::Response & res, int status, const nlohmann::json & j);
void send_error(httplib::Response & res, const openai::ApiError & e);
openai::ApiError shutting_down_error();
// Fields other servers read and this one does not: served, and named where the client and the
// operator can see them, in the X-Specula-Ignored-Fields header and the log (--strict-fields
// refuses them instead).
void note_ignored(const httplib::Request & req, httplib::Response & res, const std::vector<std::string> & fields);

}  // namespace specula
