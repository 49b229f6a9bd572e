/*
 * cdiff.h (C++): the central difference of loss() in v, with v left as it was: the emulator
 * tests check their double-precision reference backwards with it.
 */
#ifndef SL_TEST_CDIFF_H
#define SL_TEST_CDIFF_H

template <class F> static double central_diff(double &v, F &&loss, double h = 1e-5)
{
	const double v0 = v;
	double lp, lm;

	v = v0 + h;
	lp = loss();
	v = v0 - h;
	lm = loss();
	v = v0;
	return (lp - lm) / (2 * h);
}

#endif
