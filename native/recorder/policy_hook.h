/* heapcast recorder: the policy hook's interface to recorder.c (policy_hook.c). */
#ifndef HEAPCAST_POLICY_HOOK_H
#define HEAPCAST_POLICY_HOOK_H

#include <stdint.h>

extern int hc_hook_on;          /* a policy is loaded and runs on every event */

/* Loads the POLICY at policy_path and opens <pid>.pred in dir; 0 if it cannot (the program then
 * runs without a policy: `heapcast record` checked the file before starting it). */
int hc_hook_init(const char *policy_path, const char *dir, int every);
void hc_hook_fork_child(void);
void hc_hook_flush_all(void);
/* One event the recorder has just written (recorder op codes; a free's block in addr). */
void hc_hook_event(int op, uint64_t seq, uint64_t addr, uint64_t size, uint64_t old,
                   const void *callsite);

#endif
