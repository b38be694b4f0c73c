/* memfit's command list and the documents generated from the one config
 * table: `memfit help` (the usage), `memfit help --markdown` (docs/cli.md)
 * and `memfit help --bash-completion` (contrib/memfit.bash). Each printer
 * reads only the command list below and mf_config_key_info / the preset
 * table, so the checked-in files are what the binary prints
 * (tests/test_docs_cli_current.sh). */
#ifndef MEMFIT_CLI_HELP_H
#define MEMFIT_CLI_HELP_H
#include <stdio.h>
void mf_cli_usage(FILE *f);
void mf_cli_help_markdown(FILE *f);
void mf_cli_help_bash(FILE *f);
/* memfit help [--markdown | --bash-completion]: 0, or 2 with a message */
int mf_cli_help(int argc, char **argv);
#endif
