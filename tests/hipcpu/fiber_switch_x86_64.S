/* hipcpu_fiber_switch(void** save_sp, void* load_sp): saves the callee-saved registers and the
   floating-point control words on the current stack, stores the stack pointer in *save_sp,
   switches to load_sp and restores what was saved there (System V x86-64 ABI). */
    .text
    .globl hipcpu_fiber_switch
    .hidden hipcpu_fiber_switch
    .type hipcpu_fiber_switch, @function
hipcpu_fiber_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size hipcpu_fiber_switch, .-hipcpu_fiber_switch
    .section .note.GNU-stack,"",@progbits
