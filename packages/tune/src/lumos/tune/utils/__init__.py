"""Ray Tune's ``ray.tune.utils`` helpers that lumos has: ``lumos.tune.utils.mock_trainable``
(the demo ``MyTrainableClass`` of Ray's examples).

Example:
    >>> from lumos.tune.utils.mock_trainable import MyTrainableClass
    >>> tune.Tuner(MyTrainableClass, param_space={"width": 10, "height": 5})
"""
