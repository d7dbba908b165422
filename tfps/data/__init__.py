"""The training input: what a job reads, checked before any process starts.

``dataset`` finds the files, infers and checks their schema and builds the tf.data
pipelines (TensorFlow only in the pipelines); ``csvcheck`` and ``tfrecordcheck`` judge a
CSV file's rows and a TFRecord file's records; ``stream`` lists the partitions of a
followed input and plans its slices. Pure Python and NumPy below ``tfps.config``: the
launcher refuses bad data with these before it starts a task.
"""
