/* memfit eval-chat: greedy answers to chat data, scored. */
#ifndef MEMFIT_CLI_EVAL_CHAT_H
#define MEMFIT_CLI_EVAL_CHAT_H
int mf_cli_eval_chat(int argc, char **argv);
#endif
