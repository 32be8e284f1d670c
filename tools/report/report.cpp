#include "report.h"

#include <filesystem>
#include <fstream>

#include "specula/error.h"
#include "live_page.h"
#include "report_page.h"

namespace specula::report {

namespace {

constexpr const char * kDataSlot = "/*SPECULA_DATA*/null";

void require(bool ok, const std::string & where, const std::string & what) {
    if (!ok) throw Error(where + ": " + what);
}

bool exit_layer_value(const nlohmann::json & v) { return v.is_null() || (v.is_number_integer() && v.get<long long>() >= 0); }

// A token line's fields the page reads, with the types it expects.
void check_token_line(const nlohmann::json & j, const std::string & where) {
    for (const char * k : {"round", "position", "depth", "token"}) require(j.contains(k) && j[k].is_number_integer(), where, std::string("no integer '") + k + "'");
    for (const char * k : {"q", "p", "accept_prob", "draft_ms", "verify_ms"}) require(j.contains(k) && j[k].is_number(), where, std::string("no number '") + k + "'");
    require(j.contains("outcome") && j["outcome"].is_string(), where, "no 'outcome'");
    const std::string o = j["outcome"];
    require(o == "accepted" || o == "rejected" || o == "correction" || o == "bonus", where, "unknown outcome '" + o + "'");
    require(j.contains("text") && j["text"].is_string(), where, "no 'text'");
    if (j.contains("exit_layer")) require(exit_layer_value(j["exit_layer"]), where, "'exit_layer' is neither a layer nor null");
}

// SpecEE's lossy mode: one token and the layer it exited at (null: it ran the full LM head).
void check_exit_line(const nlohmann::json & j, const std::string & where) {
    for (const char * k : {"position", "token", "n_layer"}) require(j.contains(k) && j[k].is_number_integer(), where, std::string("no integer '") + k + "'");
    require(j.contains("text") && j["text"].is_string(), where, "no 'text'");
    require(j.contains("exit_layer") && exit_layer_value(j["exit_layer"]), where, "no 'exit_layer' (a layer or null)");
    require(j["exit_layer"].is_null() || j["exit_layer"].get<long long>() <= j["n_layer"].get<long long>(), where,
            "'exit_layer' is past the model's 'n_layer'");
}

void check_round_line(const nlohmann::json & j, const std::string & where) {
    for (const char * k : {"round", "position", "asked", "verified_nodes"}) require(j.contains(k) && j[k].is_number_integer(), where, std::string("no integer '") + k + "'");
    for (const char * k : {"draft_ms", "verify_ms"}) require(j.contains(k) && j[k].is_number(), where, std::string("no number '") + k + "'");
    require(j.contains("accepted") && j["accepted"].is_array(), where, "no 'accepted' node list");
    require(j.contains("tree") && j["tree"].is_object(), where, "no 'tree'");
    const auto & t = j["tree"];
    size_t n = 0;
    for (const char * k : {"token", "parent", "depth", "q", "path_prob", "text"}) {
        require(t.contains(k) && t[k].is_array(), where, std::string("tree has no '") + k + "' list");
        require(k == std::string("token") || t[k].size() == n, where, std::string("tree's '") + k + "' list has another length than its tokens");
        n = t[k].size();
    }
    for (size_t i = 0; i < n; ++i) {
        const auto & p = t["parent"][i];
        require(p.is_number_integer() && p.get<long long>() >= -1 && p.get<long long>() < static_cast<long long>(i), where,
                "tree node " + std::to_string(i) + " has a parent that is not an earlier node");
    }
    if (t.contains("exit_layer")) {
        require(t["exit_layer"].is_array() && t["exit_layer"].size() == n, where, "tree's 'exit_layer' list has another length than its tokens");
        for (const auto & l : t["exit_layer"]) require(exit_layer_value(l), where, "tree's 'exit_layer' holds neither a layer nor null");
    }
    for (const auto & a : j["accepted"]) {
        require(a.is_number_integer() && a.get<long long>() >= 0 && a.get<long long>() < static_cast<long long>(n), where, "accepted node out of the tree");
    }
}

}  // namespace

nlohmann::json read_trace(const std::string & path) {
    std::ifstream in(path);
    if (!in) throw Error(path + ": cannot open the trace");
    nlohmann::json rounds = nlohmann::json::array(), tokens = nlohmann::json::array(), exits = nlohmann::json::array();
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
        if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
        const std::string where = path + ":" + std::to_string(n);
        nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
        require(!j.is_discarded() && j.is_object(), where, "not a JSON object (is this a --trace file?)");
        if (j.value("kind", "token") == "round") {
            check_round_line(j, where);
            rounds.push_back(std::move(j));
        } else if (j.value("kind", "token") == "exit") {
            check_exit_line(j, where);
            exits.push_back(std::move(j));
        } else {
            check_token_line(j, where);
            tokens.push_back(std::move(j));
        }
    }
    if (tokens.empty() && exits.empty()) throw Error(path + ": no trace lines (an empty trace, or a plain run without a drafter?)");
    return {{"name", std::filesystem::path(path).filename().string()}, {"rounds", rounds}, {"tokens", tokens}, {"exits", exits}};
}

std::string render_page(const nlohmann::json & data) {
    std::string page(reinterpret_cast<const char *>(kReportTemplate), sizeof(kReportTemplate));
    // '<' only occurs inside JSON strings, where \u003c means the same: no "</script>" can end the block.
    std::string json;
    for (char c : data.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)) {
        if (c == '<') json += "\\u003c";
        else json += c;
    }
    const size_t at = page.find(kDataSlot);
    if (at == std::string::npos) throw Error("report template has no data slot");
    return page.replace(at, std::string(kDataSlot).size(), json);
}

std::string live_page() { return std::string(reinterpret_cast<const char *>(kLivePage), sizeof(kLivePage)); }

void write_page(const std::string & path, const nlohmann::json & data) {
    std::ofstream out(path, std::ios::trunc | std::ios::binary);
    if (!out) throw Error(path + ": cannot open the report for writing");
    out << render_page(data);
    if (!out) throw Error(path + ": cannot write the report");
}

}  // namespace specula::report
