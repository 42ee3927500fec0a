package sink

// CombineCRC32C returns the CRC32C of the concatenation A+B given crcA, the
// CRC32C of A, crcB, that of B, and lenB, B's length. It lets a data object
// built from chunk files checksummed as they were written get its CRC32C
// for the upload without reading the chunks again. The method is zlib's
// crc32_combine: appending lenB zero bits to A is a linear map over GF(2),
// applied by repeated squaring of the one-zero-bit operator.
func CombineCRC32C(crcA, crcB uint32, lenB int64) uint32 {
	if lenB <= 0 {
		return crcA
	}
	var even, odd [32]uint32
	odd[0] = 0x82f63b78 // the reflected Castagnoli polynomial: one zero bit
	row := uint32(1)
	for n := 1; n < 32; n++ {
		odd[n] = row
		row <<= 1
	}
	gf2Square(&even, &odd) // two zero bits
	gf2Square(&odd, &even) // four zero bits
	for {
		// Each round squares the operator (8, 16, ... zero bits: one
		// byte, two, ...) and applies it where lenB has a one bit.
		gf2Square(&even, &odd)
		if lenB&1 != 0 {
			crcA = gf2Times(&even, crcA)
		}
		lenB >>= 1
		if lenB == 0 {
			break
		}
		gf2Square(&odd, &even)
		if lenB&1 != 0 {
			crcA = gf2Times(&odd, crcA)
		}
		lenB >>= 1
		if lenB == 0 {
			break
		}
	}
	return crcA ^ crcB
}

func gf2Times(mat *[32]uint32, vec uint32) uint32 {
	var sum uint32
	for i := 0; vec != 0; i, vec = i+1, vec>>1 {
		if vec&1 != 0 {
			sum ^= mat[i]
		}
	}
	return sum
}

func gf2Square(square, mat *[32]uint32) {
	for n := range 32 {
		square[n] = gf2Times(mat, mat[n])
	}
}
