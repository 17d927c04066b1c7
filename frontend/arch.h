/* Private to the model builders (frontend/arch*.c): the architectures kiln builds. */
#ifndef KILN_FE_ARCH_H
#define KILN_FE_ARCH_H

#include "kiln.h"

typedef enum { FE_ARCH_LLAMA, FE_ARCH_QWEN2, FE_ARCH_QWEN3, FE_ARCH_QWEN3MOE, FE_ARCH_COUNT } fe_arch;

/* The arch named name, or -1. */
int         fe_arch_find(const char *name);
const char *fe_arch_name(fe_arch a);
/* "llama, qwen2, qwen3, qwen3moe", for messages. */
const char *fe_arch_list(void);

#endif
