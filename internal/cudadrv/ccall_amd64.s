//go:build linux

#include "textflag.h"

// ccallSeqTramp runs on the system stack (runtime.cgocall -> asmcgocall)
// with DI pointing at a cseq: frames 0, n 8, done 16. For i in 0..n-1 it
// calls frames[i] (a cframe: fn 0, args 8..96, twelve words; r1 104),
// passing args 1-6 in DI, SI, DX, CX, R8, R9 and 7-12 on the stack, as the
// System V AMD64 ABI wants, and stores RAX in r1; it stops after the first
// call whose 32-bit result is not zero and stores in done how many returned
// zero. ccall is a cseq of one frame.
// Frame: C stack arguments 0-47, current frame 56, i 64, cseq 72 (80 bytes:
// with the return address and the saved frame pointer the stack is 16-byte
// aligned at the CALL).
GLOBL ·ccallSeqTrampABI0(SB), NOPTR|RODATA, $8
DATA ·ccallSeqTrampABI0(SB)/8, $ccallSeqTramp(SB)

TEXT ccallSeqTramp(SB), NOSPLIT, $80
	MOVQ DI, 72(SP)
	MOVQ $0, 64(SP)

seqloop:
	MOVQ 72(SP), R11
	MOVQ 64(SP), AX
	CMPQ AX, 8(R11)
	JGE  seqend
	IMULQ $112, AX
	ADDQ 0(R11), AX
	MOVQ AX, R11
	MOVQ R11, 56(SP)
	MOVQ 56(R11), R12
	MOVQ R12, 0(SP)
	MOVQ 64(R11), R12
	MOVQ R12, 8(SP)
	MOVQ 72(R11), R12
	MOVQ R12, 16(SP)
	MOVQ 80(R11), R12
	MOVQ R12, 24(SP)
	MOVQ 88(R11), R12
	MOVQ R12, 32(SP)
	MOVQ 96(R11), R12
	MOVQ R12, 40(SP)
	MOVQ 8(R11), DI
	MOVQ 16(R11), SI
	MOVQ 24(R11), DX
	MOVQ 32(R11), CX
	MOVQ 40(R11), R8
	MOVQ 48(R11), R9
	MOVQ 0(R11), R10
	XORL AX, AX
	CALL R10
	MOVQ 56(SP), R11
	MOVQ AX, 104(R11)
	TESTL AX, AX
	JNZ  seqend
	MOVQ 64(SP), AX
	INCQ AX
	MOVQ AX, 64(SP)
	JMP  seqloop

seqend:
	MOVQ 72(SP), R11
	MOVQ 64(SP), AX
	MOVQ AX, 16(R11)
	RET
