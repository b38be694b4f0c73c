/* memfit convert: checkpoint format conversions (joining ZeRO shards). */
#ifndef MEMFIT_CLI_CONVERT_H
#define MEMFIT_CLI_CONVERT_H
int mf_cli_convert(int argc, char **argv);
#endif
