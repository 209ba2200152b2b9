/* routes.c - every URL nxd-http answers, in one table. */
#include "http/nxh.h"

const struct nxh_route nxh_routes[] = {
	{ "POST", "/v1/chat/completions", false, NXH_R_JSON, "chat_completions", nxh_chat_begin, nxh_gen_build,
	  nxh_gen_event },
	{ "POST", "/v1/completions", false, NXH_R_JSON, "completions", nxh_completion_begin, nxh_gen_build,
	  nxh_gen_event },
	{ "GET", "/v1/models", false, 0, "models", nxh_info_begin, nxh_models_build, nxh_models_event },
	{ "GET", "/v1/models/", true, 0, "models", nxh_info_begin, nxh_models_build, nxh_models_event },
	{ "POST", "/tokenize", false, NXH_R_JSON, "tokenize", nxh_tokenize_begin, nxh_tok_build, nxh_tok_event },
	{ "POST", "/detokenize", false, NXH_R_JSON, "detokenize", nxh_detokenize_begin, nxh_tok_build, nxh_tok_event },
	{ "GET", "/health", false, NXH_R_OPEN, "health", nxh_info_begin, nxh_status_build, nxh_health_event },
	{ "GET", "/metrics", false, 0, "metrics", nxh_info_begin, nxh_metrics_build, nxh_metrics_event },
	{ "POST", "/api/chat", false, NXH_R_JSON | NXH_R_OLLAMA, "ollama_chat", nxh_ollama_chat_begin, nxh_gen_build,
	  nxh_ollama_gen_event },
	{ "POST", "/api/generate", false, NXH_R_JSON | NXH_R_OLLAMA, "ollama_generate", nxh_ollama_generate_begin,
	  nxh_gen_build, nxh_ollama_gen_event },
	{ "GET", "/api/tags", false, NXH_R_OLLAMA, "ollama_tags", nxh_ollama_plain_begin, nxh_ollama_info_build,
	  nxh_ollama_info_event },
	{ "GET", "/api/ps", false, NXH_R_OLLAMA, "ollama_ps", nxh_ollama_plain_begin, nxh_ollama_info_build,
	  nxh_ollama_info_event },
	{ "POST", "/api/show", false, NXH_R_JSON | NXH_R_OLLAMA, "ollama_show", nxh_ollama_show_begin,
	  nxh_ollama_info_build, nxh_ollama_info_event },
	{ "GET", "/api/version", false, NXH_R_OLLAMA, "ollama_version", nxh_ollama_plain_begin, nxh_ollama_info_build,
	  nxh_ollama_info_event },
	{ "POST", "/admin/", true, NXH_R_JSON | NXH_R_ADMIN, "admin", nxh_admin_begin, nxh_admin_build,
	  nxh_admin_event },
};

const size_t nxh_n_routes = sizeof(nxh_routes) / sizeof(nxh_routes[0]);
