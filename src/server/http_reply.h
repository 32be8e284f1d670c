#pragma once
// What the HTTP handlers send: a JSON body with its status, and OpenAI's error objects.
#include <httplib.h>

#include <nlohmann/json.hpp>

#include "server/openai.h"

namespace specula {

void send_json(httplib::Response & res, int status, const nlohmann::json & j);
void send_error(httplib::Response & res, const openai::ApiError & e);
openai::ApiError shutting_down_error();

}  // namespace specula
