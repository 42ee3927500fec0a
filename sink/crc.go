package sink

import "sync"

// CombineCRC32C returns the CRC32C of the concatenation A+B given crcA, the
// CRC32C of A, crcB, that of B, and lenB, B's length. It lets a data object
// built from chunk files checksummed as they were written get its CRC32C
// for the upload without reading the chunks again. The method is zlib's
// crc32_combine: appending lenB zero bytes to A is a linear map over GF(2),
// the product of the maps that append 2^k zero bytes for each one bit k of
// lenB. Those 64 maps are computed once (zeroOps), so a combine costs at
// most 64 matrix-vector products, whatever lenB is: the consumer combines
// once per chunk and per extent, thousands of times a cycle.
func CombineCRC32C(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA
	}
	ops := zeroOps()
	for k := 0; lenB != 0; k, lenB = k+1, lenB>>1 {
		if lenB&1 != 0 {
			crcA = gf2Times(&ops[k], crcA)
		}
	}
	return crcA ^ crcB
}

// zeroOps are the operators that append 2^k zero bytes to a CRC32C, for k
// from 0 to 63: each the square of the one before, starting from eight
// zero bits.
var zeroOps = sync.OnceValue(func() *[64][32]uint32 {
	var bit, two, four [32]uint32
	bit[0] = 0x82f63b78 // the reflected Castagnoli polynomial: one zero bit
	row := uint32(1)
	for n := 1; n < 32; n++ {
		bit[n] = row
		row <<= 1
	}
	gf2Square(&two, &bit)
	gf2Square(&four, &two)
	var ops [64][32]uint32
	gf2Square(&ops[0], &four) // eight zero bits: one byte
	for k := 1; k < 64; k++ {
		gf2Square(&ops[k], &ops[k-1])
	}
	return &ops
})

func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := range mat {
		sum ^= mat[i] & -(vec >> i & 1) // no branch on the bit
	}
	return sum
}

func gf2Square(square, mat *[32]uint32) {
	for n := range 32 {
		square[n] = gf2Times(mat, mat[n])
	}
}
