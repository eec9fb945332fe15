//go:build linux

#include "textflag.h"

// ccallSeqTramp runs on the system stack (runtime.cgocall -> asmcgocall)
// with R0 pointing at a cseq: frames 0, n 8, done 16. For i in 0..n-1 it
// calls frames[i] (a cframe: fn 0, args 8..96, twelve words; r1 104),
// passing args 1-8 in R0-R7 and 9-12 on the stack, as AAPCS64 wants, and
// stores R0 in r1; it stops after the first call whose 32-bit result is not
// zero and stores in done how many returned zero. ccall is a cseq of one
// frame. Stack: C stack arguments 0-31, current frame 32, i 40, cseq 48
// (64 bytes keep RSP 16-byte aligned).
GLOBL ·ccallSeqTrampABI0(SB), NOPTR|RODATA, $8
DATA ·ccallSeqTrampABI0(SB)/8, $ccallSeqTramp(SB)

TEXT ccallSeqTramp(SB), NOSPLIT, $0
	SUB  $64, RSP
	MOVD R0, 48(RSP)
	MOVD ZR, 40(RSP)

seqloop:
	MOVD 48(RSP), R9
	MOVD 40(RSP), R10
	MOVD 8(R9), R11
	CMP  R11, R10
	BGE  seqend
	MOVD $112, R11
	MUL  R11, R10, R10
	MOVD 0(R9), R11
	ADD  R11, R10, R9
	MOVD R9, 32(RSP)
	MOVD 72(R9), R10
	MOVD R10, 0(RSP)
	MOVD 80(R9), R10
	MOVD R10, 8(RSP)
	MOVD 88(R9), R10
	MOVD R10, 16(RSP)
	MOVD 96(R9), R10
	MOVD R10, 24(RSP)
	MOVD 8(R9), R0
	MOVD 16(R9), R1
	MOVD 24(R9), R2
	MOVD 32(R9), R3
	MOVD 40(R9), R4
	MOVD 48(R9), R5
	MOVD 56(R9), R6
	MOVD 64(R9), R7
	MOVD 0(R9), R10
	BL   (R10)
	MOVD 32(RSP), R9
	MOVD R0, 104(R9)
	MOVW R0, R10
	CBNZW R10, seqend
	MOVD 40(RSP), R10
	ADD  $1, R10, R10
	MOVD R10, 40(RSP)
	B    seqloop

seqend:
	MOVD 48(RSP), R9
	MOVD 40(RSP), R10
	MOVD R10, 16(R9)
	ADD  $64, RSP
	RET
